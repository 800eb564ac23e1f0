"""Schema 9, the message record: what the wire holds is not written again. A message the AMQP codec decoded keeps
its application properties in its wire bytes (``StoredMessage.sections`` says where), read back from there when
asked; its body's offset is the codec's. A schema 8 file (which wrote the properties again as JSON) is read as it
was."""

from __future__ import annotations

import asyncio
import json
import pickle
import sqlite3
from pathlib import Path

import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.amqp.codec import decode_message
from oncebus.broker import ManualClock, Namespace
from oncebus.core.entities import QueueProperties
from oncebus.core.errors import StoreError
from oncebus.core.messages import Message, MessageState, StoredMessage, WireProperties, WireSections
from oncebus.core.sending import stored_message
from oncebus.store.base import PutMessage, UpdateMessage
from oncebus.store.memory import MemoryStore
from oncebus.store.sqlite import SCHEMA_VERSION, SqliteStore

T0 = 1_700_000_000_000_000
PROPERTIES = {"kind": "order", "count": 7, "urgent": True, "weight": 2.5}
FIXTURE_8 = Path(__file__).parent / "fixtures" / "schema8.db"
FIXTURE_9 = Path(__file__).parent / "fixtures" / "schema9.db"


def _wire(n: int, properties: dict[str, object] | None = None, body: bytes | None = None) -> bytes:
    """The realistic message (``properties={}``: without an application-properties section)."""
    message = proton.Message(
        id=f"m-{n}",
        subject="orders",
        content_type="application/json",
        correlation_id=f"c-{n}",
        properties=dict(PROPERTIES, n=n) if properties is None else (properties or None),
        body=f"body {n}".encode() if body is None else body,
    )
    message.inferred = True  # a data section, as the SDK sends bytes
    return bytes(message.encode())


def _record(n: int, **kwargs: object) -> StoredMessage:
    props = QueueProperties.create("q")
    return stored_message(props, decode_message(_wire(n, **kwargs)), f"m-{n}", n, T0 + n, None)  # type: ignore[arg-type]


def _meta(store: SqliteStore, seq: int) -> dict[str, object]:
    row = store._db.execute("SELECT meta FROM message WHERE path = 'q' AND sequence_number = ?", (seq,)).fetchone()
    return json.loads(row[0])  # type: ignore[no-any-return]


def test_the_codec_says_where_the_body_and_the_properties_are_in_the_wire() -> None:
    wire = _wire(1)
    message = decode_message(wire)
    assert message.sections is not None
    offset = message.sections.body_offset
    assert wire[offset : offset + len(message.body)] == message.body == b"body 1"
    start, end = message.sections.application_properties or (0, 0)
    assert WireProperties(wire, (start, end)) == dict(PROPERTIES, n=1) == message.application_properties
    without = decode_message(_wire(2, properties={}))
    assert without.sections is not None and without.sections.application_properties is None


def test_a_record_does_not_write_the_properties_its_wire_holds_and_reads_them_back_when_asked(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    store.load()
    records = [_record(1), _record(2, properties={})]
    store.submit([PutMessage(m) for m in records]).result()
    meta = _meta(store, 1)
    sections = records[0].sections
    assert sections is not None and sections.application_properties is not None
    assert "application_properties" not in meta and meta["ap"] == list(sections.application_properties)
    # schema 10: nor its text fields: where the properties section is
    assert not {"subject", "content_type", "correlation_id"} & set(meta) and meta["pr"] == list(
        sections.properties or ()
    )
    assert set(meta) == {"message_id", "ap", "pr"}
    assert "ap" not in _meta(store, 2) and "application_properties" not in _meta(store, 2)
    # the body is addressed where the codec found it
    row = store._db.execute("SELECT body_offset, body_length FROM message WHERE sequence_number = 1").fetchone()
    assert row == (sections.body_offset, len(b"body 1"))
    read = store.read_messages("q", [1, 2])
    props = read[1].application_properties
    assert isinstance(props, WireProperties) and not props.read  # nothing read until asked
    assert read[1].body == b"body 1" and read[1].wire == records[0].wire
    assert dict(props) == dict(PROPERTIES, n=1) and props.read
    assert read[2].application_properties == {}
    assert read[1].subject == "orders" and read[1].correlation_id == "c-1"
    assert (read[1].content_type, read[1].to, read[1].reply_to) == ("application/json", None, None)
    assert read[1].sections is not None and read[1].sections.properties == sections.properties
    store.close()


def test_every_text_field_the_properties_section_holds_is_read_back_from_the_wire(tmp_path: Path) -> None:
    message = proton.Message(
        id="m-1",
        subject="s",
        content_type="text/plain",
        correlation_id="c",
        address="to-here",
        reply_to="back",
        reply_to_group_id="rs",
        group_id="g",
        body=b"b",
    )
    message.inferred = True
    wire = bytes(message.encode())
    decoded = decode_message(wire)
    decoded.partition_key = "g"
    record = stored_message(QueueProperties.create("q"), decoded, "m-1", 1, T0, None)
    store = SqliteStore(tmp_path / "oncebus.db")
    store.load()
    store.submit([PutMessage(record)]).result()
    assert set(_meta(store, 1)) == {"message_id", "partition_key", "pr"}
    read = store.read_messages("q", [1])[1]
    fields = ("subject", "content_type", "correlation_id", "to", "reply_to", "reply_to_session_id", "session_id")
    assert [getattr(read, f) for f in fields] == ["s", "text/plain", "c", "to-here", "back", "rs", "g"]
    assert read.partition_key == "g" and read == record
    store.close()


def test_wire_properties_behave_as_the_dict_they_become() -> None:
    wire = _wire(1)
    message = decode_message(wire)
    span = message.sections.application_properties  # type: ignore[union-attr]
    assert span is not None
    expected = dict(PROPERTIES, n=1)

    def fresh() -> WireProperties:
        return WireProperties(wire, span)

    assert fresh() == expected and expected == fresh() and fresh() == fresh()
    assert len(fresh()) == 5 and bool(fresh()) and "kind" in fresh() and fresh()["count"] == 7
    assert fresh().get("missing", 1) == 1 and list(fresh()) == list(expected) and dict(**fresh()) == expected
    assert {**fresh()} == expected and fresh().copy() == expected and fresh() | {"x": 1} == {**expected, "x": 1}
    assert json.loads(json.dumps(fresh())) == expected and repr(fresh()) == repr(expected)
    assert json.loads(json.dumps({"p": fresh()})) == {"p": expected}
    assert pickle.loads(pickle.dumps(fresh())) == expected
    changed = fresh()
    changed["kind"] = "refund"
    changed.update(extra=1)
    assert changed == {**expected, "kind": "refund", "extra": 1}
    assert not WireProperties(wire, span) != expected


def test_abandon_with_modified_properties_merges_them_into_those_of_the_wire(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    store = SqliteStore(path)
    store.load()
    store.submit([PutMessage(_record(1))]).result()
    store.submit([UpdateMessage("q", 1, 0, 1, {"kind": "retried", "attempt": 2})]).result()
    meta = _meta(store, 1)
    assert "ap" not in meta and meta["rewritten"] == ["application_properties"]
    read = store.read_messages("q", [1])[1]
    assert read.application_properties == {**PROPERTIES, "n": 1, "kind": "retried", "attempt": 2}
    assert read.rewritten == frozenset({"application_properties"})
    store.close()


def test_through_the_broker_a_restart_reads_the_properties_from_the_wire(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"

    async def go() -> None:
        clock = ManualClock(T0)
        store = SqliteStore(path)
        ns = await Namespace.open(store, clock)
        await ns.create_queue("q")
        await ns.send("q", [decode_message(_wire(1)), Message(b"http", "m-h", application_properties={"k": "v"})])
        await ns.close()
        store.close()
        again = SqliteStore(path)
        ns = await Namespace.open(again, clock)
        received = await ns.receive("q", 10)
        assert [m.body for m in received] == [b"body 1", b"http"]
        peeked = ns.peek_messages("q", 10)
        assert [dict(m.application_properties) for m in peeked] == [dict(PROPERTIES, n=1), {"k": "v"}]
        assert [m.to_dict()["application_properties"] for m in peeked] == [dict(PROPERTIES, n=1), {"k": "v"}]
        assert [m.subject for m in peeked] == ["orders", None]
        await ns.close()
        again.close()

    asyncio.run(go())


def test_the_memory_store_keeps_the_record_as_it_is() -> None:
    store = MemoryStore()
    store.load()
    store.submit([PutMessage(_record(1))]).result()
    assert store.read_messages("q", [1])[1].application_properties == dict(PROPERTIES, n=1)


def test_a_record_without_sections_writes_its_properties_as_before(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    store.load()
    fake = StoredMessage("q", 1, "m-1", b"x", T0, None, wire=b"w" * 10, application_properties={"k": 1})
    told = StoredMessage(
        "q", 2, "m-2", b"x", T0, None, wire=b"x" * 10, application_properties={"k": 2}, sections=WireSections(9)
    )  # sections without properties beside properties: kept as JSON, not lost
    store.submit([PutMessage(fake), PutMessage(told)]).result()
    assert _meta(store, 1)["application_properties"] == {"k": 1}
    assert _meta(store, 2)["application_properties"] == {"k": 2}
    read = store.read_messages("q", [1, 2])
    assert read[1].application_properties == {"k": 1} and read[2].application_properties == {"k": 2}
    assert read[2].body == b"x"
    store.close()


def test_a_schema_8_file_is_migrated_and_reads_every_message_as_written(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    path.write_bytes(FIXTURE_8.read_bytes())
    store = SqliteStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    snapshot = store.load()
    assert [(r[0], r[1]) for r in snapshot.messages] == [("q", 1), ("q", 2), ("q", 3)]
    read = store.read_messages("q", [1, 2, 3])
    assert [dict(read[n].application_properties) for n in (1, 2)] == [dict(PROPERTIES, n=n) for n in (1, 2)]
    assert read[3].application_properties == {"k": "v"} and read[3].time_to_live_us == 3_600_000_000
    assert [read[n].body for n in (1, 2, 3)] == [b"body 1", b"body 2", b"no wire"]
    assert read[1].subject == "orders" and read[1].correlation_id == "c-1"
    # a schema 8 message abandoned with modifications, and a new one beside it
    store.submit([UpdateMessage("q", 2, 0, 1, {"kind": "retried"})]).result()
    store.submit([PutMessage(_record(4))]).result()
    assert "ap" in _meta(store, 4) and "application_properties" in _meta(store, 1)
    store.close()
    again = SqliteStore(path)
    again.load()
    read = again.read_messages("q", [1, 2, 4])
    assert read[2].application_properties == {**PROPERTIES, "n": 2, "kind": "retried"}
    assert read[4].application_properties == dict(PROPERTIES, n=4)
    again.close()


def test_a_schema_9_file_is_migrated_in_place_and_reads_every_message_and_key_as_written(tmp_path: Path) -> None:
    """schema9.db (tests/store/fixtures/make_schema9.py, written by the schema 9 store): its rows' meta holds the text
    fields; they read as written, and so do the keys, the counters, a topic's shared content and an abandon's
    modified properties; a message written after it keeps its text fields in the wire alone."""
    path = tmp_path / "oncebus.db"
    path.write_bytes(FIXTURE_9.read_bytes())
    store = SqliteStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    snapshot = store.load()
    assert [(r[0], r[1]) for r in snapshot.messages] == [
        ("q", 1),
        ("q", 2),
        ("q", 3),
        ("q", 4),
        ("t/subscriptions/a", 1),
        ("t/subscriptions/b", 1),
    ]
    assert {e: dict(keys) for e, keys in _keys(store).items()} == {
        "q": {"gone": T0, **{f"m-{n}": T0 + n for n in (1, 2, 3, 4)}},
        "t": {"m-5": T0 + 5},
    }
    read = store.read_messages("q", [1, 2, 3, 4])
    for n in (1, 2, 4):
        assert (read[n].subject, read[n].content_type, read[n].correlation_id) == (
            "orders",
            "application/json",
            f"c-{n}",
        )
    assert [dict(read[n].application_properties) for n in (1, 2)] == [dict(PROPERTIES, n=n) for n in (1, 2)]
    assert read[4].application_properties == {**PROPERTIES, "n": 4, "kind": "retried"}
    assert read[3].application_properties == {"k": "v"} and read[3].time_to_live_us == 3_600_000_000
    assert [read[n].body for n in (1, 2, 3, 4)] == [b"body 1", b"body 2", b"no wire", b"body 4"]
    copies = [store.read_messages(f"t/subscriptions/{name}", [1])[1] for name in "ab"]
    for copy in copies:
        assert (copy.session_id, copy.partition_key, copy.subject, copy.correlation_id) == (
            "s-1",
            "s-1",
            "orders",
            "c-5",
        )
        assert copy.time_to_live_us == 3_600_000_000 and dict(copy.application_properties) == dict(PROPERTIES, n=5)
    assert copies[0].wire == copies[1].wire
    # written after: the text fields in the wire only; a schema 9 row abandoned with modifications
    store.submit([PutMessage(_record(5)), UpdateMessage("q", 1, 0, 1, {"kind": "again"})]).result()
    assert "pr" in _meta(store, 5) and "subject" not in _meta(store, 5) and _meta(store, 1)["subject"] == "orders"
    store.close()
    again = SqliteStore(path)
    again.load()
    read = again.read_messages("q", [1, 5])
    assert read[1].application_properties == {**PROPERTIES, "n": 1, "kind": "again"} and read[1].subject == "orders"
    assert read[5].subject == "orders" and read[5].correlation_id == "c-5"
    assert read[5].application_properties == dict(PROPERTIES, n=5)
    again.close()


def _keys(store: SqliteStore) -> dict[str, list[tuple[str, int]]]:
    found: dict[str, list[tuple[str, int]]] = {}
    for entity, key, t0 in store._db.execute("SELECT entity, key, first_accepted_us FROM dedup_key"):
        found.setdefault(entity, []).append((key, t0))
    return found


def test_a_file_of_a_later_schema_is_refused(tmp_path: Path) -> None:
    """The version is what keeps an earlier release (which would not find the properties in the wire) away."""
    path = tmp_path / "oncebus.db"
    store = SqliteStore(path)
    store.close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(
        StoreError, match=f"store schema {SCHEMA_VERSION + 1}; this version reads up to {SCHEMA_VERSION}"
    ):
        SqliteStore(path)


def test_new_and_other_messages_in_one_unit_are_written_in_order_whatever_statement_writes_them(
    tmp_path: Path,
) -> None:
    """Most sends' messages go through the short insert (active, never delivered, no expiry, no session); the
    others through the full one, in the order added: a message put twice in one unit keeps the last row."""
    import dataclasses

    store = SqliteStore(tmp_path / "oncebus.db")
    store.load()
    plain = _record(1)
    sessioned = dataclasses.replace(_record(2), session_id="s", expires_at_us=T0 + 10**6, delivery_count=2)
    first = dataclasses.replace(_record(3), delivery_count=5)  # then put again as new: the new row stays
    store.submit([PutMessage(m) for m in (plain, sessioned, first, _record(3))]).result()
    rows = store._db.execute(
        "SELECT sequence_number, state, delivery_count, expires_at_us, session_id FROM message ORDER BY 1"
    ).fetchall()
    assert rows == [(1, 0, 0, None, None), (2, 0, 2, T0 + 10**6, "s"), (3, 0, 0, None, None)]
    read = store.read_messages("q", [1, 2, 3])
    assert read[1] == plain and read[2] == sessioned and read[3] == _record(3)
    assert store._db.execute("SELECT COUNT(*), SUM(refs) FROM content").fetchone() == (3, 3)
    store.close()


_IDS = st.one_of(
    st.text(min_size=1, max_size=12),  # quotes, backslashes and non-ASCII too: escaped in the meta, the JSON path
    st.from_regex(r"[A-Za-z0-9-]{1,12}", fullmatch=True),  # the usual: the meta read without the JSON decoder
    st.uuids(),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.binary(min_size=1, max_size=8),
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    message_id=_IDS,
    subject=st.none() | st.text(max_size=8),
    properties=st.none() | st.dictionaries(st.text(min_size=1, max_size=4), st.integers(-5, 5), max_size=3),
    partition_key=st.none() | st.text(min_size=1, max_size=8),
    ttl=st.none() | st.integers(min_value=1, max_value=10_000),
    state=st.sampled_from(list(MessageState)),
    delivery_count=st.integers(min_value=0, max_value=9),
    session_id=st.none() | st.text(min_size=1, max_size=8),
    dead_letter_reason=st.none() | st.text(max_size=8),
)
def test_a_row_reads_back_the_same_whether_its_meta_is_read_by_the_fast_path_or_the_json_decoder(
    message_id: object,
    subject: str | None,
    properties: dict[str, int] | None,
    partition_key: str | None,
    ttl: int | None,
    state: MessageState,
    delivery_count: int,
    session_id: str | None,
    dead_letter_reason: str | None,
) -> None:
    """``StoredMessage.from_row`` reads the usual meta (a text id, the wire's spans) without the JSON decoder: what
    it gives equals what the decoder gives for the same meta written with spaces (which the fast path never takes),
    and the record the meta was written from."""
    wire_id = message_id if not isinstance(message_id, int) else proton.ulong(message_id)
    message = proton.Message(id=wire_id, subject=subject, properties=properties or None, body=b"the body")
    message.inferred = True
    if partition_key is not None:
        message.annotations = {proton.symbol("x-opt-partition-key"): partition_key}
    if ttl is not None:
        message.ttl = ttl
    decoded = decode_message(bytes(message.encode()))
    record = stored_message(QueueProperties.create("q"), decoded, decoded.message_id, 7, T0, None)
    assert record.sections is not None and record.wire is not None
    meta = record.meta_json()
    spaced = json.dumps(json.loads(meta))  # the same values; the fast path does not match it
    assert " " in spaced
    row = {
        "path": "q",
        "sequence_number": 7,
        "state": int(state),
        "delivery_count": delivery_count,
        "enqueued_time_us": record.enqueued_time_us,
        "expires_at_us": record.expires_at_us,
        "body": record.body,
        "wire": record.wire,
        "session_id": session_id,
        "dead_letter_reason": dead_letter_reason,
        "body_offset": record.sections.body_offset,
    }
    fast, slow = StoredMessage.from_row(meta=meta, **row), StoredMessage.from_row(meta=spaced, **row)  # type: ignore[arg-type]
    assert fast == slow and fast.sections == slow.sections
    assert dict(fast.application_properties) == dict(slow.application_properties) == (properties or {})
    assert (fast.message_id, fast.subject, fast.partition_key) == (record.message_id, record.subject, partition_key)
    assert (fast.state, fast.delivery_count, fast.session_id) == (state, delivery_count, session_id)
    assert fast.dead_letter_reason == dead_letter_reason and fast.time_to_live_us == record.time_to_live_us
