"""Issue 18, item 10: empty-bodied messages count toward the entity's size quota; ids are measured as Azure does."""

from __future__ import annotations

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.errors import InvalidArgumentError, QuotaExceededError
from oncebus.store.memory import MemoryStore
from tests.broker.conftest import run

EMOJI = "\N{GRINNING FACE}"  # one code point, two UTF-16 code units


def test_empty_messages_fill_the_size_quota() -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q", max_size_in_megabytes=1)
        sent = 0
        with pytest.raises(QuotaExceededError, match="max_size_in_megabytes=1"):
            while sent < 100_000:  # each costs the server memory: the quota must end this well before
                await ns.send("q", [Message(b"") for _ in range(500)])
                sent += 500
        assert sent <= 1024 * 1024 // 64, sent
        assert ns.stats("q").accepted == sent  # a refused send stored nothing
        await ns.close()

    run(go())


@pytest.mark.parametrize("field", ["message_id", "session_id", "partition_key"])
def test_ids_count_utf16_code_units(field: str) -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q", enable_partitioning=True)
        fits = {field: EMOJI * 64}  # 128 UTF-16 code units: allowed
        if field != "message_id":
            fits["partition_key" if field == "session_id" else "session_id"] = fits[field]
        await ns.send("q", Message(b"x", **fits))
        over = {field: EMOJI * 64 + "a"}
        if field != "message_id":
            over["partition_key" if field == "session_id" else "session_id"] = over[field]
        with pytest.raises(InvalidArgumentError, match=r"129 UTF-16 code units.*at most 128"):
            await ns.send("q", Message(b"x", **over))
        assert ns.stats("q").accepted == 1
        await ns.close()

    run(go())
