"""A stand-in for ``devtools_testutils``, the Azure SDK repository's test toolkit (not on PyPI), as much of it as
azure-servicebus 7.15.0's tests import, live only: nothing is recorded or played back, the sanitizers and matchers
do nothing, and the decorators just call the test (with the keyword arguments its preparers make).

The preparers create what a test asks for in the namespace the suite's conftest.py made for it on
``oncebus serve`` (oncebus_live.py); ``get_credential()`` gives the SDK's shared-key credential with that
namespace's key, which both ``ServiceBusClient`` and ``ServiceBusAdministrationClient`` take, and which oncebus
verifies (every SAS token's signature, expiry and audience).
"""

from __future__ import annotations

from typing import Any

import oncebus_live

from .preparers import (
    AbstractPreparer,
    AzureMgmtPreparer,
    CachedResourceGroupPreparer,
    FakeResource,
    PowerShellPreparer,
    RandomNameResourceGroupPreparer,
    ResourceGroupPreparer,
)
from .proxy import recorded_by_proxy, set_custom_default_matcher
from .sanitizers import (
    add_general_regex_sanitizer,
    add_oauth_response_sanitizer,
    add_remove_header_sanitizer,
)

__all__ = [
    "AbstractPreparer",
    "AzureMgmtPreparer",
    "AzureMgmtRecordedTestCase",
    "AzureRecordedTestCase",
    "AzureTestError",
    "CachedResourceGroupPreparer",
    "FakeResource",
    "PowerShellPreparer",
    "RandomNameResourceGroupPreparer",
    "ReservedResourceNameError",
    "ResourceGroupPreparer",
    "add_general_regex_sanitizer",
    "add_oauth_response_sanitizer",
    "add_remove_header_sanitizer",
    "get_credential",
    "get_region_override",
    "is_live",
    "recorded_by_proxy",
    "set_custom_default_matcher",
]


class AzureTestError(Exception):
    pass


class ReservedResourceNameError(AzureTestError):
    pass


class AzureRecordedTestCase:
    """The tests' base class: live, never in playback."""

    is_live = True
    in_recording = False
    test_resources_count = 0


class AzureMgmtRecordedTestCase(AzureRecordedTestCase):
    pass


def is_live() -> bool:
    return True


def get_region_override(default: str = "westus") -> str:
    return default


def get_credential(**kwargs: Any) -> Any:
    """The namespace's key (``RootManageSharedAccessKey@<the test's namespace>``) as the SDK's own shared-key
    credential (what ``from_connection_string`` makes): ``is_async=True`` for the ``aio`` clients."""
    if kwargs.get("is_async"):
        from azure.servicebus.aio._base_handler_async import ServiceBusSharedKeyCredential as AsyncCredential

        return AsyncCredential(oncebus_live.key_name(), oncebus_live.key())
    from azure.servicebus._base_handler import ServiceBusSharedKeyCredential

    return ServiceBusSharedKeyCredential(oncebus_live.key_name(), oncebus_live.key())
