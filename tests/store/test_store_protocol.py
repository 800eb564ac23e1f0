"""Every store implements the whole ``Store`` protocol, signature for signature: the broker calls its hooks
(``commit_now``, the dedup image hooks, the commit observer) directly, never finding them by name."""

from __future__ import annotations

import inspect

import pytest

from oncebus.store.base import Store
from oncebus.store.memory import MemoryStore
from oncebus.store.postgres import PostgresStore
from oncebus.store.sqlite import SqliteStore


def _declared() -> dict[str, object]:
    return {name: value for name, value in vars(Store).items() if not name.startswith("_") and callable(value)}


def test_the_protocol_declares_the_hooks_the_broker_calls() -> None:
    assert {"commit_now", "checkpoint_dedup", "keep_dedup_images", "submit", "load", "close"} <= set(_declared())
    assert "commit_observer" in Store.__annotations__


@pytest.mark.parametrize("store", [MemoryStore, SqliteStore, PostgresStore])
def test_a_store_has_every_member_with_the_same_signature(store: type) -> None:
    for name, declared in _declared().items():
        real = getattr(store, name, None)
        assert real is not None, f"{store.__name__} has no {name}"
        want = [(p.name, p.kind, p.default) for p in inspect.signature(declared).parameters.values()]  # type: ignore[arg-type]
        got = [(p.name, p.kind, p.default) for p in inspect.signature(real).parameters.values()]
        assert got == want, f"{store.__name__}.{name}"


def test_the_memory_store_starts_no_checkpoint_and_commits_nothing_on_the_side() -> None:
    store = MemoryStore()
    assert store.commit_now([]) is False
    assert store.checkpoint_dedup([], 0) is False
    store.keep_dedup_images(list, 0)
    assert store.commit_observer is None
