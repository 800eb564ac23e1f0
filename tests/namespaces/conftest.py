from __future__ import annotations

from collections.abc import Iterator

import pytest

from oncebus.testing import OncebusServer, serve


@pytest.fixture(scope="module")
def broker() -> Iterator[OncebusServer]:
    """One broker for the module (in a thread: the fastest start); each test creates the namespaces it needs."""
    with serve(mode="thread") as server:
        yield server
