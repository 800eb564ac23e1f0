"""``Namespace.reset`` and the control operations behind the fresh namespace per test (``namespace.reset``,
``clock.tick``), on the SQLite store: what a reset deletes stays deleted across a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

from oncebus.broker import Message, Namespace
from oncebus.broker.clock import ManualClock
from oncebus.broker.control import dispatch
from oncebus.store.sqlite import SqliteStore


def test_reset_deletes_everything_durably_and_lets_the_time_start_again(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock()
        store = SqliteStore(tmp_path / "oncebus.db")
        ns = await Namespace.open(store, clock)
        await ns.create_queue("orders", requires_duplicate_detection=True)
        await ns.create_topic("events", requires_duplicate_detection=True)
        await ns.create_subscription("events", "audit")
        await ns.send("orders", [Message(b"a", message_id="1")])
        await ns.send("events", [Message(b"e", message_id="1")])
        clock.advance(86_400)
        await ns.send("orders", [Message(b"b", message_id="2")])
        assert (await dispatch(ns, "namespace.reset", {}))["now_us"] == clock.now_us()
        assert ns.entity_names() == []
        await ns.close()
        store.close()

        store = SqliteStore(tmp_path / "oncebus.db")
        ns = await Namespace.open(store, ManualClock(start_us=1_700_000_000_000_000))
        assert ns.entity_names() == []
        await ns.create_queue("orders", requires_duplicate_detection=True)
        (outcome,) = await ns.send("orders", [Message(b"again", message_id="1")])
        assert not outcome.duplicate and outcome.sequence_number == 1
        stats = ns.stats("orders").to_dict()
        assert (stats["accepted"], stats["duplicates_dropped"], stats["active_message_count"]) == (1, 0, 1)
        await ns.close()
        store.close()

    asyncio.run(go())


def test_reset_forgets_the_time_floor_so_a_rewound_clock_is_read_again(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock()
        store = SqliteStore(tmp_path / "oncebus.db")
        ns = await Namespace.open(store, clock)
        await ns.create_queue("q", requires_duplicate_detection=True)
        clock.advance(3600)
        await ns.send("q", [Message(b"a", message_id="1")])
        ahead = clock.now_us()
        rewound = ManualClock(start_us=ahead - 3_600_000_000)
        ns.clock = rewound  # as the file clock does when the testing API writes a lower offset
        assert (await dispatch(ns, "clock.tick", {}))["now_us"] == rewound.now_us()
        assert ns.stats("q").oldest_key_age_seconds == 0.0  # held at the floor until the reset
        await dispatch(ns, "namespace.reset", {})
        await ns.create_queue("q", requires_duplicate_detection=True)
        (outcome,) = await ns.send("q", [Message(b"a", message_id="1")])
        (stored,) = ns.peek_messages("q", 1)
        assert not outcome.duplicate
        assert round(stored.enqueued_time_utc.timestamp() * 1e6) == rewound.now_us()  # the rewound time
        await ns.close()
        store.close()

    asyncio.run(go())
