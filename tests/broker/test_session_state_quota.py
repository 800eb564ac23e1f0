"""Issue 33, item 4: session states count toward their entity's size, as Service Bus counts them.

A state that would take its queue (or subscription) past ``max_size_in_megabytes`` is refused with
``QuotaExceededError``, the state left as it was; the size the runtime properties report includes the states,
exactly, after replacing and clearing one and after a restart; sends meet the room the states take.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from oncebus.broker import (
    ManualClock,
    Message,
    Namespace,
    TransactionRollbackError,
    queue_runtime_properties,
    subscription_runtime_properties,
    topic_runtime_properties,
)
from oncebus.core.errors import QuotaExceededError
from oncebus.store.base import Store
from oncebus.store.memory import MemoryStore
from tests.broker.conftest import StoreFactory, run

MB = 1024 * 1024
STATE = 200_000  # the issue's: 200 KB on each of 120 sessions of a 1 MB queue, 24 MB stored
PER_STATE = 256  # what each state counts on top of its size (as each message does)
FITS = MB // (STATE + PER_STATE)  # 5


async def _fill(ns: Namespace, path: str) -> int:
    """Sets a 200 KB state on one session after another until one is refused; how many were set."""
    for number in range(120):
        session = await ns.accept_session(path, f"s{number}")
        try:
            await ns.set_session_state(session, b"x" * STATE)
        except QuotaExceededError as exc:
            assert "max_size_in_megabytes=1" in str(exc)
            assert await ns.get_session_state(session) is None  # the refused state was not set
            await ns.close_session(session)
            return number
        await ns.close_session(session)
    return 120


async def _state(ns: Namespace, path: str, session_id: str) -> bytes | None:
    session = await ns.accept_session(path, session_id)
    try:
        return await ns.get_session_state(session)
    finally:
        await ns.close_session(session)


async def _set(ns: Namespace, path: str, session_id: str, state: bytes | None) -> None:
    session = await ns.accept_session(path, session_id)
    try:
        await ns.set_session_state(session, state)
    finally:
        await ns.close_session(session)


def test_session_states_fill_a_queue_and_are_refused_past_its_size() -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q", requires_session=True, max_size_in_megabytes=1)
        assert await _fill(ns, "q") == FITS
        assert queue_runtime_properties(ns, "q").size_in_bytes == FITS * STATE
        assert ns.stats("q").size_in_bytes == FITS * STATE

        # a send past the room the states leave is refused as well, with the same error
        with pytest.raises(QuotaExceededError, match="max_size_in_megabytes=1"):
            await ns.send("q", Message(b"y" * 100_000, session_id="s0"))

        # a state refused where one was set already leaves the old one
        with pytest.raises(QuotaExceededError):
            await _set(ns, "q", "s0", b"z" * (STATE + 100_000))
        assert await _state(ns, "q", "s0") == b"x" * STATE

        # replacing by a smaller state and clearing one free their room, exactly
        await _set(ns, "q", "s0", b"small")
        await _set(ns, "q", "s1", None)
        assert queue_runtime_properties(ns, "q").size_in_bytes == (FITS - 2) * STATE + len(b"small")
        await ns.send("q", Message(b"y" * 100_000, session_id="s0"))
        assert queue_runtime_properties(ns, "q").size_in_bytes == (FITS - 2) * STATE + 5 + 100_000
        await _set(ns, "q", "s1", b"x" * STATE)  # the room freed takes a state again
        with pytest.raises(QuotaExceededError):
            await _set(ns, "q", "s1000", b"x" * STATE)
        await ns.close()

    run(go())


def test_a_smaller_state_is_taken_even_when_the_queue_is_over_its_size() -> None:
    """The size lowered below what the states take: nothing is dropped, and shrinking a state is not refused."""

    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q", requires_session=True, max_size_in_megabytes=2)
        for number in range(8):
            await _set(ns, "q", f"s{number}", b"x" * STATE)
        await ns.update_queue("q", max_size_in_megabytes=1)
        await _set(ns, "q", "s0", b"x" * (STATE - 1))
        await _set(ns, "q", "s1", b"x" * (STATE - 1))  # the same size again (and again: no growth)
        with pytest.raises(QuotaExceededError):
            await _set(ns, "q", "s2", b"x" * (STATE + 1))
        with pytest.raises(QuotaExceededError):
            await _set(ns, "q", "new", b"")  # an empty state counts too (a session's row)
        assert queue_runtime_properties(ns, "q").size_in_bytes == 8 * STATE - 2
        await ns.close()

    run(go())


def test_a_subscriptions_states_count_toward_it_and_its_topic() -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_topic("t", max_size_in_megabytes=1)
        await ns.create_subscription("t", "sessions", requires_session=True)
        await ns.create_subscription("t", "nothing", rules=[])  # takes no copy: its size stays 0
        assert await _fill(ns, "t/Subscriptions/sessions") == FITS
        path = "t/subscriptions/sessions"  # paths are kept lowercase
        assert subscription_runtime_properties(ns, "t", "sessions").size_in_bytes == FITS * STATE
        assert topic_runtime_properties(ns, "t").size_in_bytes == FITS * STATE
        with pytest.raises(QuotaExceededError, match=repr(path)):  # the full subscription refuses the topic's send
            await ns.send("t", Message(b"y" * 100_000, session_id="s0"))
        await ns.close()

    run(go())


def test_session_states_in_a_transaction_are_held_to_the_size_with_its_sends() -> None:
    """A transaction's states and sends together: refused at the commit, nothing of it stored, before any of it
    is applied (a refusal halfway through the commit would leave memory ahead of the store)."""

    async def go() -> None:
        owner = object()
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q", requires_session=True, max_size_in_megabytes=1)
        for number in range(FITS - 1):
            await _set(ns, "q", f"s{number}", b"x" * STATE)
        session = await ns.accept_session("q", "last")
        txn = ns.transactions.declare(owner)
        ns.transactions.set_session_state(txn, owner, session, b"x" * STATE)  # fits alone...
        ns.transactions.send(txn, owner, "q", "q", [Message(b"y" * 100_000, session_id="last")])  # ...not with this
        with pytest.raises(TransactionRollbackError, match="max_size_in_megabytes=1"):
            await ns.transactions.discharge(txn, owner, fail=False)
        assert await ns.get_session_state(session) is None
        assert ns.stats("q").active_message_count == 0
        assert ns.reloads == 0  # refused before anything moved

        txn = ns.transactions.declare(owner)
        ns.transactions.set_session_state(txn, owner, session, b"x" * STATE)
        ns.transactions.set_session_state(txn, owner, session, b"x" * STATE)  # the same session twice: once
        ns.transactions.send(txn, owner, "q", "q", [Message(b"y" * 1000, session_id="last")])
        await ns.transactions.discharge(txn, owner, fail=False)
        assert queue_runtime_properties(ns, "q").size_in_bytes == FITS * STATE + 1000
        await ns.close()

    run(go())


async def size_is_kept_across_a_restart(open_store: Callable[[], Store]) -> None:
    """Also run on PostgreSQL (tests/store/test_postgres_store.py): ``open_store`` opens the same store again."""
    clock = ManualClock()
    ns = await Namespace.open(open_store(), clock)
    await ns.create_queue("q", requires_session=True, max_size_in_megabytes=1)
    await ns.send("q", Message(b"m" * 100_000, session_id="s0"))
    assert await _fill(ns, "q") == FITS - 1  # the message takes the room of the last
    await _set(ns, "q", "s0", b"replaced")
    await _set(ns, "q", "s1", None)
    size = (FITS - 3) * STATE + len(b"replaced") + 100_000
    assert queue_runtime_properties(ns, "q").size_in_bytes == size
    await ns.close()

    ns = await Namespace.open(open_store(), clock)
    assert queue_runtime_properties(ns, "q").size_in_bytes == size
    assert await _state(ns, "q", "s0") == b"replaced"
    await _set(ns, "q", "s1", b"x" * STATE)
    await _set(ns, "q", "s9", b"x" * STATE)
    with pytest.raises(QuotaExceededError):  # the states restored count toward the size
        await _set(ns, "q", "s10", b"x" * STATE)
    assert queue_runtime_properties(ns, "q").size_in_bytes == size + 2 * STATE
    await ns.close()


def test_the_size_with_session_states_is_the_same_after_a_restart(stores: StoreFactory) -> None:
    run(size_is_kept_across_a_restart(stores.open))
