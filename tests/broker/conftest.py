from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from oncebus.store.memory import MemoryStore
from oncebus.store.sqlite import SqliteStore

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class StoreFactory:
    """Opens the same durable store again, as a restarted broker would."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.path = tmp_path / "oncebus.db"
        self._memory = MemoryStore()
        self._open: list[SqliteStore] = []

    def open(self) -> MemoryStore | SqliteStore:
        if self.kind == "memory":
            return self._memory
        for store in self._open:
            store.close()
        self._open = [SqliteStore(self.path)]
        return self._open[0]

    def close(self) -> None:
        for store in self._open:
            store.close()


@pytest.fixture(params=["memory", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()
