"""Application property values at the broker API (issue 33 item 2): one check in the core refuses what some door
could not carry, for a send and for an abandon's modifications alike; a message stored before it did (as a REST
send stored an integer past 64 bits) is dead-lettered when it comes up, and never blocks the others."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from oncebus.broker import ManualClock, Message, Namespace, ServiceBusReceiveMode
from oncebus.core.errors import InvalidArgumentError
from oncebus.store.base import UpdateMessage
from oncebus.store.memory import MemoryStore
from tests.broker.conftest import StoreFactory, run

RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE


@pytest.mark.parametrize(
    ("properties", "error"),
    [
        ({"big": 2**64}, r"'big' is the integer 18446744073709551616, out of range.*-2\*\*63 to 2\*\*64 - 1"),
        ({"low": -(2**63) - 1}, r"'low' is the integer -9223372036854775809, out of range"),
        ({"huge": 10**5000}, r"'huge' is a 5001-digit integer, out of range"),
        ({"tags": ["a"]}, r"'tags' is a list, which is not a property value; a value is a string"),
        ({"map": {"a": 1}}, r"'map' is a map"),
        ({"odd": object()}, r"'odd' is a value of type object"),
        ({"text": "a\ud800"}, r"'text' holds '\\ud800' at 1, a lone UTF-16 surrogate"),
        ({"\udc00": 1}, r"the name of application property '\\udc00' holds"),
    ],
)
def test_a_property_value_no_door_carries_is_refused_naming_it(properties: dict[str, Any], error: str) -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        with pytest.raises(InvalidArgumentError, match=f"message 2 of 2: .*{error}"):
            await ns.send("q", [Message(b"ok"), Message(b"x", application_properties={"fine": 1, **properties})])
        assert ns.stats("q").active_message_count == 0  # the batch is refused whole

    run(go())


def test_a_lone_surrogate_in_a_text_field_is_refused() -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        for fields in ({"subject": "s\ud800"}, {"message_id": "\udfff"}, {"session_id": "\ud800"}):
            with pytest.raises(InvalidArgumentError, match="lone UTF-16 surrogate"):
                await ns.send("q", Message(b"x", **fields))

    run(go())


EDGES: dict[str, Any] = {
    "long_min": -(2**63),
    "ulong_max": 2**64 - 1,
    "none": None,
    "inf": math.inf,
    "nan": math.nan,
    "binary": b"\x00\xff",
    "uuid": uuid.UUID(int=7),
    "time": datetime(2030, 1, 2, tzinfo=UTC),
    "duration": timedelta(seconds=90),
    "decimal": Decimal("1.25"),
    "text": "naïve ☃ 𝄞",
}


def test_every_simple_value_is_taken() -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        await ns.send("q", Message(b"x", application_properties=dict(EDGES)))
        (got,) = await ns.receive("q", receive_mode=RAD)
        assert set(got.application_properties) == set(EDGES)

    run(go())


def test_a_settlement_modifying_a_property_to_what_no_door_carries_is_refused_and_the_lock_kept() -> None:
    """An abandon's, a defer's and a dead-letter's properties to modify go through the core's check, as a send's."""

    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        await ns.send("q", Message(b"x", application_properties={"n": 1}))
        (got,) = await ns.receive("q")
        token = got.lock_token
        assert token is not None
        with pytest.raises(InvalidArgumentError, match="application property 'n' is the integer 1000"):
            await ns.abandon("q", token, {"n": 10**30})
        with pytest.raises(InvalidArgumentError, match="'tags' is a list"):
            await ns.defer("q", token, {"tags": [1]})
        with pytest.raises(InvalidArgumentError, match="'m' is a map"):
            await ns.dead_letter("q", token, "r", "d", properties_to_modify={"m": {"a": 1}})
        await ns.abandon("q", token, {"n": 2})  # the lock was kept; a valid change is taken
        (again,) = await ns.receive("q", receive_mode=RAD)
        assert dict(again.application_properties) == {"n": 2}

    run(go())


def test_a_message_stored_with_such_a_value_is_dead_lettered_and_the_others_delivered(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await Namespace.open(stores.open(), clock)
        for queue in ("locking", "deleting"):
            await ns.create_queue(queue)
            await ns.send(queue, [Message(body) for body in (b"before", b"poison", b"after")])
        await ns.close()
        store = stores.open()
        for queue in ("locking", "deleting"):  # as a REST send stored it before the doors refused such values
            store.submit([UpdateMessage(queue, 2, 0, 0, {"big": 10**30, "kept": "yes"})]).result()
        ns = await Namespace.open(store, clock)
        first = await ns.receive("locking", 1)
        rest = await ns.receive("locking", 10)
        assert [m.body for m in first + rest] == [b"before", b"after"]
        taken = await ns.receive("deleting", 10, receive_mode=RAD)
        assert [m.body for m in taken] == [b"before", b"after"]
        for queue in ("locking", "deleting"):
            (dead,) = await ns.receive(f"{queue}/$DeadLetterQueue", 10, receive_mode=RAD)
            assert dead.body == b"poison" and dead.dead_letter_reason == "InvalidApplicationProperty"
            assert "'big' is the integer 1000000000000000000000000000000" in (dead.dead_letter_error_description or "")
            assert dict(dead.application_properties) == {"big": str(10**30), "kept": "yes"}  # as text, nothing lost
            assert ns.stats(queue).dead_letter_message_count == 0
        await ns.close()

    run(go())
