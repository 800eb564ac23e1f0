"""The admin client cannot store a name ending in a newline (issue 18, item 6): a clear 400, listing still works."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.http.conftest import Served, trust_ca_for_old_sdks


@pytest.fixture
def admin(server: Served, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceBusAdministrationClient]:
    trust_ca_for_old_sdks(server.ca_file, monkeypatch)
    with ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=server.ca_file
    ) as client:
        yield client


@pytest.mark.parametrize("suffix", ["\n", "\r\n"])
def test_admin_create_queue_with_a_trailing_newline_is_refused(
    admin: ServiceBusAdministrationClient, name: str, suffix: str
) -> None:
    with pytest.raises(HttpResponseError) as raised:
        admin.create_queue(name + suffix)
    assert raised.value.status_code == 400, raised.value
    with pytest.raises(HttpResponseError):
        admin.create_topic(name + "t" + suffix)
    listed = [q.name for q in admin.list_queues()]  # listing still works for everyone
    assert all("\n" not in q for q in listed) and name not in listed
