"""A failure of ours while a send's records are built, after its keys were judged (a bug, a message the record
builder did not foresee), must not leave those keys held without their messages stored: the client gets the
error, and its resend of the same MessageId is accepted and stored once, not dropped as a duplicate. Memory is
reloaded from the store, as after a failed write. The failure is injected into the record builder
(``core.sending.stored_message`` as the sender calls it); everything else is real (SQLite and memory stores)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from oncebus.broker import ManualClock, Message, Namespace, sending
from oncebus.core.errors import StoreWriteError
from tests.broker.conftest import StoreFactory, run


class BuildFailure(RuntimeError):
    pass


def _fail_at(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    """The ``index``-th record built from now on raises (once); the others are built as usual."""
    real = sending.stored_message
    calls = [0]

    def building(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == index + 1:
            raise BuildFailure(f"record {index} could not be built")
        return real(*args, **kwargs)

    monkeypatch.setattr(sending, "stored_message", building)


async def _send_until_accepted(ns: Namespace, entity: str, batch: list[Message]) -> list[Any]:
    """What a client with retries does: send again while the broker says it is busy reloading (it reloads once no
    write is in flight, after a short real delay)."""
    for _ in range(500):
        try:
            return await ns.send(entity, batch)
        except StoreWriteError:
            await asyncio.sleep(0.01)
    raise AssertionError("the resend was never accepted")


@pytest.mark.parametrize("failing", [0, 2], ids=["first-record", "last-record"])
@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_send_whose_records_fail_to_build_can_be_sent_again(
    stores: StoreFactory, monkeypatch: pytest.MonkeyPatch, kind: str, failing: int
) -> None:
    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(1_800_000_000_000_000))
        if kind == "queue":
            await ns.create_queue("e", requires_duplicate_detection=True)
            path = "e"
        else:
            await ns.create_topic("e", requires_duplicate_detection=True)
            await ns.create_subscription("e", "s")
            path = "e/subscriptions/s"
        await ns.send("e", Message(b"before", message_id="before"))
        batch = [Message(f"m{i}".encode(), message_id=f"m{i}") for i in range(3)]
        reloads = ns.reloads
        _fail_at(monkeypatch, failing)
        with pytest.raises(BuildFailure):
            await ns.send("e", batch)
        monkeypatch.undo()
        outcomes = await _send_until_accepted(ns, "e", batch)
        assert [o.duplicate for o in outcomes] == [False, False, False]  # none of them was stored before
        assert ns.reloads == reloads + 1  # memory was reloaded from the store, as after a failed write
        again = await ns.send("e", [*batch, Message(b"before", message_id="before")])
        assert [o.duplicate for o in again] == [True, True, True, True]
        bodies = sorted(bytes(m.body) for m in ns.peek_messages(path, 10))
        assert bodies == [b"before", b"m0", b"m1", b"m2"]  # each stored once
        await ns.close()
        ns = await Namespace.open(stores.open(), ManualClock(1_800_000_000_000_000))  # and so in the store
        assert sorted(bytes(m.body) for m in ns.peek_messages(path, 10)) == [b"before", b"m0", b"m1", b"m2"]
        await ns.close()

    run(go())
