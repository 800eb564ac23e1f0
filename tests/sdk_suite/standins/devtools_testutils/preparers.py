"""Preparers, live only: each makes its resource when the test is called and hands the test its keyword arguments.

Every test runs in a namespace of its own (the suite's conftest.py), so what a preparer makes is never shared with
another test (``use_cache`` changes nothing) and goes away with the namespace (``remove_resource`` has nothing to
do unless a preparer says otherwise).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from .proxy import accepted
from .resource_testcase import RESOURCE_GROUP_PARAM


class FakeResource(NamedTuple):
    name: str
    id: str


class AbstractPreparer:
    def __init__(self, name_prefix: str = "", name_len: int = 24, **options: Any) -> None:
        self.name_prefix = name_prefix
        self.name_len = max(name_len, len(name_prefix) + 8)
        self.options = options

    def random_name(self) -> str:
        return (self.name_prefix + uuid.uuid4().hex)[: self.name_len]

    def create_resource(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return {}

    def remove_resource(self, name: str, **kwargs: Any) -> None:
        return None

    def set_cache(self, *args: Any) -> None:
        return None

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def prepared(test_class_instance: Any, **kwargs: Any) -> Any:
            name = self.random_name()
            kwargs.update(self.create_resource(name, **kwargs))
            try:
                arguments = accepted(fn, kwargs)
                if inspect.iscoroutinefunction(fn):
                    return asyncio.run(fn(test_class_instance, **arguments))
                return fn(test_class_instance, **arguments)
            finally:
                self.remove_resource(name, **kwargs)

        functools.update_wrapper(prepared, fn)
        return prepared


class AzureMgmtPreparer(AbstractPreparer):
    def __init__(self, name_prefix: str = "", name_len: int = 24, **options: Any) -> None:
        super().__init__(name_prefix, name_len, **options)
        self.is_live = True


class ResourceGroupPreparer(AzureMgmtPreparer):
    """A resource group exists only in ARM: a name, handed to the test."""

    def __init__(
        self,
        name_prefix: str = "",
        use_cache: bool = False,
        random_name_length: int = 75,
        parameter_name: str = RESOURCE_GROUP_PARAM,
        parameter_name_for_location: str = "location",
        location: str = "westus",
        **options: Any,
    ) -> None:
        super().__init__(name_prefix, min(random_name_length, 40), **options)
        self.parameter_name = parameter_name
        self.parameter_name_for_location = parameter_name_for_location
        self.location = location

    def create_resource(self, name: str, **kwargs: Any) -> dict[str, Any]:
        group = FakeResource(name=name, id=f"/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/{name}")
        return {self.parameter_name: group, self.parameter_name_for_location: self.location}


CachedResourceGroupPreparer = functools.partial(ResourceGroupPreparer, use_cache=True)
RandomNameResourceGroupPreparer = ResourceGroupPreparer


class PowerShellPreparer(AzureMgmtPreparer):
    """Live, each of its keyword arguments named after ``directory`` comes from the environment variable of that
    name in upper case (the fakes given are for playback): the suite's conftest.py sets them for each test."""

    def __init__(self, directory: str, name_prefix: str = "", **kwargs: Any) -> None:
        super().__init__(name_prefix, 24)
        self.directory = directory
        self.keys = [key for key in kwargs if directory in key]

    def create_resource(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return {key: os.environ[key.upper()] for key in self.keys}
