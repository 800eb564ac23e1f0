"""Typed message ids (AMQP string, binary, uuid, ulong) at the broker API, through a restart."""

from __future__ import annotations

import uuid

import pytest

from oncebus.broker import ManualClock, Message, Namespace, ServiceBusReceiveMode
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.keys import MessageId
from tests.broker.conftest import StoreFactory, run

RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE
U = uuid.UUID("12345678-1234-5678-1234-567812345678")

# every pair here differs, though several have the same text in some conversion (UTF-8 with replacement,
# Service Bus's ToString(): hex, the UUID's text, decimal) or the same bytes
DISTINCT: list[MessageId] = [
    b"\x01\xff\x10",
    b"\x01\xfe\x10",
    b"\x01\x80\x10",
    "\x01\ufffd\x10",
    "01FF10",
    "01ff10",
    b"01ff10",
    "\x00b01ff10",  # a string id that looks like the binary id's key text
    "\x00s\x00b01ff10",
    U,
    str(U),
    U.bytes,
    "\x00u" + str(U),
    5,
    "5",
    b"5",
    b"\x05",
    "\x00i5",
    2**64 - 1,
    "abc",
    b"abc",
]


@pytest.mark.parametrize("partitioned", [False, True])
def test_distinct_ids_never_collide_and_come_back_with_their_type(stores: StoreFactory, partitioned: bool) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("q", requires_duplicate_detection=True, enable_partitioning=partitioned)
        outcomes = await ns.send("q", [Message(b"%d" % i, message_id=mid) for i, mid in enumerate(DISTINCT)])
        assert [o.duplicate for o in outcomes] == [False] * len(DISTINCT)
        assert [o.message_id for o in outcomes] == DISTINCT
        peeked = ns.peek_messages("q", 100)
        assert [m.message_id for m in peeked] == DISTINCT
        assert [type(m.message_id) for m in peeked] == [type(mid) for mid in DISTINCT]
        await ns.close()

        ns = await Namespace.open(stores.open(), clock)  # restart: ids keep their types, keys their meaning
        resent = await ns.send("q", [Message(b"again", message_id=mid) for mid in DISTINCT])
        assert all(o.duplicate for o in resent)
        got = await ns.receive("q", 100, receive_mode=RAD)
        assert [m.message_id for m in got] == DISTINCT
        assert [type(m.message_id) for m in got] == [type(mid) for mid in DISTINCT]
        assert ns.stats("q").accepted == len(DISTINCT)
        assert ns.stats("q").duplicates_dropped == len(DISTINCT)

    run(go())


def test_the_three_binary_ids_of_the_issue_are_three_messages(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock())
        await ns.create_queue("q", requires_duplicate_detection=True)
        for raw in (b"\x01\xff\x10", b"\x01\xfe\x10", b"\x01\x80\x10"):
            assert not (await ns.send("q", Message(b"x", message_id=raw)))[0].duplicate
        assert (await ns.send("q", Message(b"x", message_id=bytearray(b"\x01\xff\x10"))))[0].duplicate
        assert [m.message_id for m in await ns.receive("q", 5, receive_mode=RAD)] == [
            b"\x01\xff\x10",
            b"\x01\xfe\x10",
            b"\x01\x80\x10",
        ]

    run(go())


def test_a_typed_id_partitions_like_a_string_id() -> None:
    async def go() -> None:
        from oncebus.store.memory import MemoryStore

        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("p", requires_duplicate_detection=True, enable_partitioning=True)
        sends = [
            Message(b"", message_id=7, partition_key="a"),
            Message(b"", message_id=7, partition_key="b"),  # another partition: not a duplicate
            Message(b"", message_id=7, session_id="a"),  # the same partition, the same id: a duplicate
            Message(b"", message_id=7),  # partitioned by its own id
            Message(b"", message_id="7"),  # the string "7" is another id
        ]
        assert [o.duplicate for o in await ns.send("p", sends)] == [False, False, True, False, False]

    run(go())


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"partition_key": b"pk"}, "partition_key must be text (a string), not bytes"),
        ({"partition_key": 5}, "partition_key must be text (a string), not int"),
        ({"session_id": U}, "session_id must be text (a string), not UUID"),
        ({"message_id": -1}, "not a ulong"),
        ({"message_id": 2**64}, "not a ulong"),
        ({"message_id": True}, "not bool"),
        ({"message_id": 1.5}, "must be a string, binary (bytes), a UUID or a ulong (int), not float"),
        ({"message_id": b""}, "binary of 0 bytes"),
        ({"message_id": b"x" * 65}, "binary of 65 bytes"),
        ({"message_id": ""}, "message_id is empty"),
    ],
)
def test_ids_of_the_wrong_type_or_range_are_refused(fields: dict[str, object], error: str) -> None:
    async def go() -> None:
        from oncebus.store.memory import MemoryStore

        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q", requires_duplicate_detection=True)
        await ns.create_queue("p", requires_duplicate_detection=True, enable_partitioning=True)
        for queue in ("q", "p"):
            message = Message(b"x", **{"message_id": "m", **fields})  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match=error.replace("(", r"\(").replace(")", r"\)")):
                await ns.send(queue, message)
            assert ns.stats(queue).accepted == 0

    run(go())


def test_received_typed_ids_render_as_service_bus_text_in_json() -> None:
    async def go() -> None:
        from oncebus.store.memory import MemoryStore

        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        await ns.send(
            "q", [Message(b"", message_id=b"\x01\xff"), Message(b"", message_id=U), Message(b"", message_id=9)]
        )
        shown = [m.to_dict() for m in ns.peek_messages("q", 5)]
        assert [(d["message_id"], d["message_id_type"]) for d in shown] == [
            ("01FF", "binary"),
            (str(U), "uuid"),
            (9, "ulong"),
        ]

    run(go())
