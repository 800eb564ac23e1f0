"""The floor under ``bench/amqp_send.py``'s rows: what a server that stores nothing costs the same SDK clients.

Issue 34 asks ``oncebus serve`` for at most 25 us of server CPU per message sent (0.9 of a do-nothing sink) and
at most 60 us per message received and completed (1.0 of JetStream). This bench measures, in one run, with the
SDK clients of ``bench/amqp_send.py`` (2 sender processes sending batches of 100 x 1 KiB; 4 PEEK_LOCK receiver
processes completing each message), servers that keep nothing:

- ``proton reactor``: a proton reactor program (the C engine and proton's Python event layer and handlers):
  transfers accepted, deliveries made from one prepared message, completions settled;
- ``proton on asyncio``: proton's engine driven from asyncio the way ``oncebus serve`` drives it (a Transport,
  a Collector, its events dispatched by hand; deliveries sent as prepared bytes), storing nothing;
- ``python engine``: an AMQP 1.0 session engine written here in Python on asyncio, on oncebus's own frame
  encoding (``oncebus.amqp.encoding``/``performatives``), with the SDK's own codec only for the CBS put-token
  message: each batch split into its messages, each delivery encoded from a template (a new sequence number,
  lock token and locked-until), each completion answered with its settled outcome;
- ``python engine + SQLite rows``: the same engine storing in SQLite (WAL): each batch's messages as rows,
  committed with an fsync before the batch is accepted (``synchronous=FULL``, as oncebus acknowledges a send);
  each completion deletes its row and commits before it is answered (``synchronous=NORMAL``, no fsync: as
  oncebus commits a completion);
- ``python engine + rows, settlement log``: as the row above, but a completion is an 8-byte record appended to a
  log (one ``write``, no fsync: as crash-safe as the commit it replaces) and the rows are deleted 1,000 at a time
  (the issue's "settlements appended as small records and applied in batches");
- ``python engine + oncebus's broker``: the same engine over oncebus's own broker instead of a template and rows
  (a ``Namespace`` on the SQLite store, as ``serve`` opens it): sends decoded by the AMQP door's codec and
  answered once committed, deliveries the broker's peek-locked messages encoded by the door's encoder, each
  completion through ``Namespace.complete_soon`` and answered once committed, what a receiver leaves unsettled
  let go. Everything of ``serve`` but its AMQP layer (frame scanner, session and link state machines, delivery
  objects and events, the connection's pump): what a leaner AMQP layer would leave;
- ``JetStream, sync always``: nats-server's JetStream with ``sync_interval: always`` and ``bench/amqp_send.py``'s
  JetStream clients (duplicate window on send; pull consumer, ``ack_sync``, on receive), if nats-server is here;

- ``the broker alone, in process``: oncebus's own work with no protocol at all, in a fresh process: the SDK's
  batches (encoded by the SDK beforehand) decoded by the AMQP door's codec and sent to a ``Namespace`` on the
  SQLite store by 2 concurrent senders; then received 200 at a time and completed 4 a loop turn, each turn
  waiting for its outcomes (as 4 receivers with one completion in flight each); process CPU, all threads;

and ``oncebus serve`` itself (dedup on; receive + complete), so the gaps are ratios within one run:
what proton's event layer costs against a Python engine (the design item 2 of issue 16 decides on), and what
an engine leaves for the broker and its store inside the goals. The last lines add the engine that stores
nothing to the broker alone: what the goals' 20 and 50 us would have to hold, against what they allow.

Each row: messages a second, server CPU per message (user + system, all threads, from ``/proc``). The engines
here and the broker alone run on the event loop ``oncebus serve`` runs on (uvloop where it is installed;
``ONCEBUS_EVENT_LOOP=asyncio`` runs all of them, serve included, on asyncio's own).

Usage: ``python bench/amqp_floor.py [--messages 20000] [--repeat 2] [--no-send] [--no-receive]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

import amqp_send as bench

from oncebus.amqp.encoding import NULL, Reader, encode_list, encode_symbol, encode_uint
from oncebus.amqp.performatives import (
    AMQP_HEADER,
    ATTACH,
    BATCH_MESSAGE_FORMAT,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    OPEN,
    SASL_HEADER,
    TRANSFER,
    amqp_frame,
    open_frame,
)
from oncebus.server import loop as event_loop
from oncebus.server.settings import Settings

SINK_CREDIT = 1000
SEND_GOAL_US, RECEIVE_GOAL_US = 25.0, 60.0  # issue 34's goals: server CPU a message
EVICT_KIB = 4096  # copied there and back before each turn of the cold row: past both cores' L2 here (1 MiB each)
ACCEPTED = b"\x00\x53\x24\x45"  # accepted, no fields
TRUE, FALSE = b"\x41", b"\x42"
_FRAME = struct.Struct(">IBBH")

LOOP = Settings.from_environ().event_loop  # uvloop where installed, as serve; ONCEBUS_EVENT_LOOP=asyncio


# ------------------------------------------------------------------------- the message a source delivers
def delivery_template() -> tuple[bytes, bytes, bytes]:
    """A delivered message's payload in three pieces around its sequence number and locked-until (8 bytes each).

    The sections ``oncebus serve`` gives a peek-locked delivery: a header, message annotations (sequence
    number, enqueued time, locked-until), properties (a message id) and one data section of 1 KiB.
    """
    header = b"\x00\x53\x70" + encode_list([TRUE, NULL, NULL, NULL, encode_uint(0)])
    now = int(time.time() * 1000)
    entries = [
        (encode_symbol("x-opt-enqueued-time"), b"\x83" + struct.pack(">q", now)),
        (encode_symbol("x-opt-sequence-number"), b"\x81"),  # + 8 bytes
        (encode_symbol("x-opt-locked-until"), b"\x83"),  # + 8 bytes
    ]
    # map8 with fixed-size values: the two 8-byte values are written per delivery
    body_size = sum(len(k) + len(v) for k, v in entries) + 16
    annotations_head = b"\x00\x53\x72" + bytes((0xC1, body_size + 1, 6)) + b"".join(k + v for k, v in entries[:1])
    first = annotations_head + entries[1][0] + entries[1][1]
    middle = entries[2][0] + entries[2][1]
    properties = b"\x00\x53\x73" + encode_list([b"\xa1\x24" + str(uuid.uuid4()).encode()])
    data = b"\x00\x53\x75\xb0" + struct.pack(">I", len(bench.BODY)) + bench.BODY
    return header + first, middle, properties + data


# ------------------------------------------------------------------------- a session engine in Python
class Link:
    __slots__ = ("address", "channel", "credit", "delivery_count", "handle", "sending")

    def __init__(self, channel: int, handle: int, address: str, sending: bool) -> None:
        self.channel, self.handle, self.address, self.sending = channel, handle, address, sending
        self.delivery_count = 0
        self.credit = 0


class Engine(asyncio.Protocol):
    """One client connection: SASL ANONYMOUS, open, sessions, links, CBS, and the hot path (transfers in,
    deliveries out, dispositions both ways), each frame parsed once, outputs of one read written at once."""

    def __init__(self, template: tuple[bytes, bytes, bytes], db: Rows | None) -> None:
        self.template = template
        self.db = db
        self.buffer = b""
        self.header_expected = True
        self.out: list[bytes] = []
        self.links: dict[tuple[int, int], Link] = {}
        self.cbs_reply: dict[int, Link] = {}  # channel -> the $cbs link the server sends on
        self.next_outgoing: dict[int, int] = {}  # channel -> the next transfer (delivery) id the server sends
        self.incoming: dict[int, int] = {}  # channel -> the next transfer id expected from the client
        self.unsettled: dict[tuple[int, int], int] = {}  # (channel, delivery id) -> sequence number
        self.partial: dict[tuple[int, int], tuple[int, list[bytes]]] = {}
        self.sequence = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not its subclasses)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        view = memoryview(buffer)
        pos, end = 0, len(buffer)
        while True:
            if self.header_expected:
                if end - pos < 8:
                    break
                header = bytes(buffer[pos : pos + 8])
                pos += 8
                self.header_expected = False
                if header == SASL_HEADER:
                    mechanisms = b"\x00\x53\x40" + encode_list([b"\xe0\x0c\x01\xa3" + b"\x09ANONYMOUS"])
                    self.out.append(SASL_HEADER + _FRAME.pack(8 + len(mechanisms), 2, 1, 0) + mechanisms)
                elif header == AMQP_HEADER:
                    self.out.append(AMQP_HEADER)
                else:
                    self._close()
                    return
                continue
            if end - pos < 8:
                break
            size, doff, frame_type, channel = _FRAME.unpack_from(buffer, pos)
            if end - pos < size:
                break
            body = view[pos + doff * 4 : pos + size]
            pos += size
            if len(body) == 0:
                continue  # an empty frame (heartbeat)
            if frame_type == 1:
                if body[2] == 0x41:  # sasl-init: ANONYMOUS accepted
                    outcome = b"\x00\x53\x44" + encode_list([b"\x50\x00"])
                    self.out.append(_FRAME.pack(8 + len(outcome), 2, 1, 0) + outcome)
                    self.header_expected = True
                continue
            self.frame(channel, body)
        self.buffer = buffer[pos:]
        if self.out and self.transport is not None:
            self.transport.write(b"".join(self.out))
            self.out.clear()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def frame(self, channel: int, body: memoryview) -> None:
        code = body[2]
        reader = Reader(body)
        reader.pos = 3
        if code == DISPOSITION:
            self.disposition(channel, reader.list_fields(5))
        elif code == TRANSFER:
            spans = reader.field_spans()
            fields = [Reader(body[a:b]).value() for a, b in spans[:6]]
            self.transfer(channel, fields, body[reader.pos :])
        elif code == FLOW:
            self.flow(channel, reader.list_fields(11))
        elif code == OPEN:
            self.out.append(open_frame("floor", 262144))
        elif code == BEGIN:
            fields = reader.list_fields(2)
            self.next_outgoing[channel] = 0
            self.incoming[channel] = fields[1]
            begin = [b"\x60" + struct.pack(">H", channel), encode_uint(0), encode_uint(65536), encode_uint(65536)]
            self.out.append(amqp_frame(BEGIN, [*begin, encode_uint(255), NULL, NULL, NULL], channel))
        elif code == ATTACH:
            self.attach(channel, body, reader)
        elif code == DETACH:
            handle = reader.list_fields(1)[0]
            self.links.pop((channel, handle), None)
            self.out.append(amqp_frame(DETACH, [encode_uint(handle), TRUE, NULL], channel))
        elif code == END:
            self.out.append(amqp_frame(END, [NULL], channel))
        elif code == CLOSE:
            self.out.append(amqp_frame(CLOSE, [NULL]))
            if self.transport is not None:
                self.transport.write(b"".join(self.out))
                self.out.clear()
                self.transport.close()

    def attach(self, channel: int, body: memoryview, reader: Reader) -> None:
        spans = reader.field_spans()
        raw = [bytes(body[a:b]) for a, b in spans]
        handle = Reader(raw[1]).value()
        client_sends = Reader(raw[2]).value() is False  # role false: the client is the sender
        terminus = raw[6] if client_sends else raw[5]
        address = ""
        if terminus[:1] == b"\x00":
            terminus_reader = Reader(terminus)
            terminus_reader.descriptor()
            address = str(terminus_reader.list_fields(1)[0] or "")
        link = Link(channel, handle, address, sending=not client_sends)
        self.links[(channel, handle)] = link
        initial = encode_uint(0) if link.sending else NULL
        reply = [raw[0], raw[1], FALSE if link.sending else TRUE, raw[3], raw[4], raw[5], raw[6], NULL, NULL]
        self.out.append(amqp_frame(ATTACH, [*reply, initial, NULL, NULL, NULL, NULL], channel))
        if link.sending and address == "$cbs":
            self.cbs_reply[channel] = link
        if not link.sending:
            link.delivery_count = Reader(raw[9]).value() or 0 if len(raw) > 9 else 0
            link.credit = SINK_CREDIT
            self.out.append(self._flow(link))

    def _flow(self, link: Link) -> bytes:
        channel = link.channel
        fields = [encode_uint(self.incoming[channel]), encode_uint(65536), encode_uint(self.next_outgoing[channel])]
        fields += [encode_uint(65536), encode_uint(link.handle), encode_uint(link.delivery_count)]
        fields += [encode_uint(link.credit), NULL, FALSE, FALSE, NULL]
        return amqp_frame(FLOW, fields, channel)

    def flow(self, channel: int, fields: list[Any]) -> None:
        handle = fields[4]
        if handle is None:
            return
        link = self.links.get((channel, handle))
        if link is None or not link.sending:
            return
        if fields[5] is not None and fields[6] is not None:
            link.credit = fields[5] + fields[6] - link.delivery_count
        if link.address != "$cbs":
            self.deliver(link)

    def transfer_frame(self, link: Link, tag: bytes, payload: bytes) -> tuple[int, bytes]:
        """The next delivery on ``link`` (unsettled, its 16-byte ``tag``) as one frame: (its delivery id, the frame)."""
        channel = link.channel
        delivery_id = self.next_outgoing[channel]
        self.next_outgoing[channel] = delivery_id + 1
        handle = encode_uint(link.handle)
        performative = (
            b"\x00\x53\x14\xc0"
            + bytes((len(handle) + 5 + 18 + 1 + 1 + 1 + 5 + 1, 11))
            + handle
            + b"\x70"
            + struct.pack(">I", delivery_id)
            + b"\xa0\x10"
            + tag
            + b"\x43"
            + FALSE
            + FALSE
            + NULL * 5
        )
        return delivery_id, _FRAME.pack(8 + len(performative) + len(payload), 2, 0, channel) + performative + payload

    def deliver(self, link: Link) -> None:
        head, middle, tail = self.template
        channel, out, pack_q = link.channel, self.out, struct.Struct(">q").pack
        locked_until = pack_q(int(time.time() * 1000) + 60_000)
        while link.credit > 0:
            self.sequence += 1
            payload = head + pack_q(self.sequence) + middle + locked_until + tail
            delivery_id, frame = self.transfer_frame(link, os.urandom(16), payload)
            out.append(frame)
            self.unsettled[(channel, delivery_id)] = self.sequence
            link.credit -= 1
            link.delivery_count += 1

    def disposition(self, channel: int, fields: list[Any]) -> None:
        role, first, last = fields[0], fields[1], fields[2]
        if role is not True:  # the client settles something the server asked about: nothing to do here
            return
        last = first if last is None else last
        settled = [self.unsettled.pop((channel, delivery_id), None) for delivery_id in range(first, last + 1)]
        if self.db is not None:
            self.db.settle([s for s in settled if s is not None])
        self.out.append(
            amqp_frame(DISPOSITION, [FALSE, encode_uint(first), encode_uint(last), TRUE, ACCEPTED, NULL], channel)
        )

    def transfer(self, channel: int, fields: list[Any], payload: memoryview) -> None:
        handle, delivery_id, message_format, settled, more = fields[0], fields[1], fields[3], fields[4], fields[5]
        self.incoming[channel] += 1
        link = self.links[(channel, handle)]
        key = (channel, handle)
        begun = self.partial.pop(key, None)  # (its delivery id, its frames so far): a delivery in several frames
        if begun is not None:
            delivery_id = begun[0]
            begun[1].append(bytes(payload))
        if more:
            self.partial[key] = begun or (delivery_id, [bytes(payload)])
            return
        whole = b"".join(begun[1]) if begun is not None else bytes(payload)
        link.delivery_count += 1
        link.credit -= 1
        self.arrived(channel, link, delivery_id, whole, message_format or 0, settled)
        if link.credit < SINK_CREDIT // 2:
            link.credit = SINK_CREDIT
            self.out.append(self._flow(link))

    def arrived(
        self, channel: int, link: Link, delivery_id: int, whole: bytes, message_format: int, settled: bool
    ) -> None:
        """A whole delivery from the client: a CBS request answered, anything else stored and accepted."""
        if link.address == "$cbs":
            self.cbs(channel, whole)
        else:
            self.store(whole)
        if not settled:
            reply = [TRUE, encode_uint(delivery_id), NULL, TRUE, ACCEPTED, NULL]
            self.out.append(amqp_frame(DISPOSITION, reply, channel))

    def store(self, payload: bytes) -> None:
        messages = _split_batch(payload)
        if self.db is not None:
            self.db.add(messages)

    def cbs(self, channel: int, payload: bytes) -> None:
        from azure.servicebus._pyamqp._decode import decode_payload
        from azure.servicebus._pyamqp._encode import encode_payload
        from azure.servicebus._pyamqp.message import Message, Properties

        request = decode_payload(memoryview(payload))
        reply = Message(
            properties=Properties(correlation_id=request.properties.message_id),
            application_properties={"status-code": 200, "status-description": "OK"},
        )
        body = bytearray()
        encode_payload(body, reply)
        link = self.cbs_reply[channel]
        delivery_id = self.next_outgoing[channel]
        self.next_outgoing[channel] = delivery_id + 1
        link.delivery_count += 1
        fields = [encode_uint(link.handle), encode_uint(delivery_id), b"\xa0\x04" + struct.pack(">I", delivery_id)]
        fields += [encode_uint(0), TRUE, FALSE, NULL, NULL, NULL, NULL, NULL]
        frame = amqp_frame(TRANSFER, fields, channel)
        self.out.append(_FRAME.pack(len(frame) + len(body), 2, 0, channel) + frame[8:] + bytes(body))


# ------------------------------------------------------------------------- the same engine over oncebus's broker
class BrokerEngine(Engine):
    """The Python engine above over oncebus's own broker (a ``Namespace`` on the SQLite store, as ``serve``
    opens it) instead of a template and rows: a send link's transfer is decoded by the AMQP door's codec and
    sent (accepted once committed); a receive link's deliveries are the broker's peek-locked messages, encoded
    by the door's encoder; a completion goes to ``Namespace.complete_soon`` and is answered once committed. What
    is not here is oncebus's AMQP layer (its frame scanner, session and link state machines, deliveries and
    events, connection pump): this row is the lean engine with oncebus's broker and store under it."""

    def __init__(self, template: tuple[bytes, bytes, bytes], namespace: Any) -> None:
        super().__init__(template, None)
        self.namespace = namespace
        # (channel, delivery id) -> (queue, lock token, link handle)
        self.held: dict[tuple[int, int], tuple[str, uuid.UUID, int]] = {}
        self.delivering: set[Link] = set()  # the links a delivery task serves

    def _flush(self) -> None:
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def deliver(self, link: Link) -> None:
        if link not in self.delivering:
            self.delivering.add(link)
            asyncio.get_running_loop().create_task(self._deliver(link))

    async def _deliver(self, link: Link) -> None:
        from oncebus.amqp.outgoing import encode_received, lock_token_tag

        channel = link.channel
        try:
            while link.credit > 0 and (self.transport is None or not self.transport.is_closing()):
                messages = await self.namespace.receive(link.address, min(link.credit, 2 * bench.BATCH))
                if not messages:
                    await asyncio.sleep(0.02)  # (the bench fills the queue first: only its end finds it empty)
                    continue
                for message in messages:
                    token = message.lock_token
                    payload = encode_received(message, lock_annotations=True, lock_token=token, delivered_section=True)
                    delivery_id, frame = self.transfer_frame(link, lock_token_tag(token), payload)
                    self.out.append(frame)
                    self.held[(channel, delivery_id)] = (link.address, token, link.handle)
                    link.credit -= 1
                    link.delivery_count += 1
                self._flush()
        finally:
            self.delivering.discard(link)

    def disposition(self, channel: int, fields: list[Any]) -> None:
        role, first, last = fields[0], fields[1], fields[2]
        if role is not True:
            return
        last = first if last is None else last
        taken = [self.held.pop((channel, d), None) for d in range(first, last + 1)]
        locked = [t for t in taken if t is not None]
        state = fields[4]
        if getattr(state, "descriptor", None) != 0x24:  # not accepted (released, modified): let go, not completed
            for path, token, _ in locked:
                asyncio.get_running_loop().create_task(self.namespace.abandon(path, token, failed=False))
            if not fields[3]:
                self.out.append(amqp_frame(DISPOSITION, [FALSE, encode_uint(first), encode_uint(last), TRUE], channel))
            return
        reply = amqp_frame(DISPOSITION, [FALSE, encode_uint(first), encode_uint(last), TRUE, ACCEPTED, NULL], channel)
        if not locked:
            self.out.append(reply)
            return
        left = [len(locked)]

        def done(error: BaseException | None) -> None:
            if error is not None:
                print(f"a completion failed: {error}", file=sys.stderr)
            left[0] -= 1
            if left[0] == 0:
                self.out.append(reply)
                self._flush()

        for path, token, _ in locked:
            try:
                self.namespace.complete_soon(path, token, done)
            except Exception as exc:
                done(exc)

    def frame(self, channel: int, body: memoryview) -> None:
        if body[2] == DETACH:  # a receiver that goes lets go of what it was sent and did not settle (as serve)
            handle = Reader(body[3:]).list_fields(1)[0]
            self._let_go(lambda key, held: key[0] == channel and held[2] == handle)
        super().frame(channel, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self._let_go(lambda key, held: True)

    def _let_go(self, which: Any) -> None:
        gone = [key for key, held in self.held.items() if which(key, held)]
        for key in gone:
            path, token, _ = self.held.pop(key)
            asyncio.get_running_loop().create_task(self.namespace.abandon(path, token, failed=False))

    def arrived(
        self, channel: int, link: Link, delivery_id: int, whole: bytes, message_format: int, settled: bool
    ) -> None:
        if link.address == "$cbs":
            super().arrived(channel, link, delivery_id, whole, message_format, settled)
            return
        sent = self._send(channel, link.address, delivery_id, whole, message_format, settled)
        asyncio.get_running_loop().create_task(sent)  # answered once committed

    async def _send(self, channel: int, path: str, delivery_id: int, whole: bytes, fmt: int, settled: bool) -> None:
        from oncebus.amqp import codec

        await self.namespace.send(path, codec.decode_transfer(whole, fmt))
        if not settled:
            reply = [TRUE, encode_uint(delivery_id), NULL, TRUE, ACCEPTED, NULL]
            self.out.append(amqp_frame(DISPOSITION, reply, channel))
            self._flush()


# ------------------------------------------------------------------------- proton as oncebus drives it
class ProtonEngine(asyncio.Protocol):
    """proton's engine driven from asyncio as ``oncebus serve`` drives it (a Transport, a Collector, its events
    dispatched by hand), storing nothing: deliveries sent as prepared bytes, completions settled."""

    def __init__(self, template: tuple[bytes, bytes, bytes]) -> None:
        import proton

        self.proton = proton
        self.template = template
        self.sequence = 0
        self.connection = proton.Connection()
        self.connection.container = "floor"
        self.transport = proton.Transport(proton.Transport.SERVER)
        self.transport.max_frame_size = 262144
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.transport.bind(self.connection)
        self.collector = proton.Collector()
        self.connection.collect(self.collector)
        self.cbs_reply: Any = None
        self.socket: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not its subclasses)
        self.socket = transport

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            capacity = self.transport.capacity()
            if capacity <= 0:
                break
            self.transport.push(bytes(view[:capacity]))
            view = view[capacity:]
            self.pump()
        self.pump()

    def pump(self) -> None:
        collector, event_types = self.collector, self.proton.Event
        while True:
            event = collector.peek()
            if event is None:
                break
            self.handle(event, event_types)
            collector.pop()
        while True:
            pending = self.transport.pending()
            if pending <= 0:
                if pending < 0 and self.socket is not None:
                    self.socket.close()
                break
            data = self.transport.peek(pending)
            self.transport.pop(pending)
            if self.socket is not None and data:
                self.socket.write(data)

    def handle(self, event: Any, types: Any) -> None:
        proton = self.proton
        kind = event.type
        if kind == types.DELIVERY:
            delivery = event.delivery
            link = delivery.link
            if link.is_sender:
                if delivery.updated and delivery.remote_state == proton.Delivery.ACCEPTED:
                    delivery.update(proton.Delivery.ACCEPTED)
                    delivery.settle()
                return
            if delivery.partial:
                return
            payload = link.recv(delivery.pending)
            link.advance()
            if link.remote_target.address == "$cbs":
                request = proton.Message()
                request.decode(payload)
                reply = proton.Message(
                    correlation_id=request.id, properties={"status-code": 200, "status-description": "OK"}
                )
                sender = self.cbs_reply
                reply_delivery = sender.delivery(str(self.sequence).encode())
                sender.send(reply.encode())
                sender.advance()
                reply_delivery.settle()
            else:
                _split_batch(payload)
            delivery.update(proton.Delivery.ACCEPTED)
            delivery.settle()
            if link.credit < SINK_CREDIT // 2:
                link.flow(SINK_CREDIT - link.credit)
        elif kind == types.LINK_FLOW:
            link = event.link
            if link.is_sender and link.source.address != "$cbs":
                self.deliver(link)
        elif kind == types.LINK_REMOTE_OPEN:
            link = event.link
            link.snd_settle_mode = link.remote_snd_settle_mode
            link.rcv_settle_mode = link.remote_rcv_settle_mode
            if link.is_sender:
                link.source.address = link.remote_source.address
                if link.remote_source.address == "$cbs":
                    self.cbs_reply = link
                link.open()
            else:
                link.target.address = link.remote_target.address
                link.open()
                link.flow(SINK_CREDIT)
        elif kind in (types.LINK_REMOTE_CLOSE, types.LINK_REMOTE_DETACH):
            event.link.close()
        elif kind == types.SESSION_REMOTE_OPEN:
            event.session.open()
        elif kind == types.SESSION_REMOTE_CLOSE:
            event.session.close()
        elif kind == types.CONNECTION_REMOTE_OPEN:
            self.connection.open()
        elif kind == types.CONNECTION_REMOTE_CLOSE:
            self.connection.close()

    def deliver(self, link: Any) -> None:
        head, middle, tail = self.template
        pack_q = struct.Struct(">q").pack
        locked_until = pack_q(int(time.time() * 1000) + 60_000)
        while link.credit > 0:
            self.sequence += 1
            link.delivery(os.urandom(16))
            link.send(head + pack_q(self.sequence) + middle + locked_until + tail)
            link.advance()


def _split_batch(payload: bytes) -> list[bytes]:
    """A batch's messages (each data section holds one encoded message), as any broker must split them."""
    messages = []
    reader = Reader(payload)
    while reader.pos < len(payload):
        code = reader.descriptor()
        start = reader.pos
        reader.skip()
        if code == 0x75:
            messages.append(payload[start : reader.pos])
    return messages


class Rows:
    """What the engine stores: a batch's messages as rows, committed with an fsync before the batch is accepted
    (SQLite ``synchronous=FULL``, as oncebus acknowledges a send); each completion deletes its row, committed
    before it is answered (``synchronous=NORMAL``: process-crash safe, as oncebus commits a completion)."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level="DEFERRED")
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS message (sequence INTEGER PRIMARY KEY, body BLOB)")
        self.db.executemany("INSERT INTO message (body) VALUES (?)", [(bench.BODY,)] * 200_000)
        self.db.commit()
        self.synchronous = ""

    def _mode(self, synchronous: str) -> None:
        if synchronous != self.synchronous:
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            self.synchronous = synchronous

    def add(self, messages: list[bytes]) -> None:
        self._mode("FULL")
        self.db.executemany("INSERT INTO message (body) VALUES (?)", [(m,) for m in messages])
        self.db.commit()

    def settle(self, sequences: list[int]) -> None:
        self._mode("NORMAL")
        self.db.executemany("DELETE FROM message WHERE sequence = ?", [(s,) for s in sequences])
        self.db.commit()


class LoggedRows(Rows):
    """As ``Rows``, but a completion is one 8-byte record appended to a settlement log (one ``write``, no fsync:
    process-crash safe, as the commit it replaces) and the rows are deleted in batches of 1,000 (one commit)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.log = os.open(path + ".settled", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.pending: list[tuple[int]] = []

    def settle(self, sequences: list[int]) -> None:
        os.write(self.log, b"".join(struct.pack(">Q", s) for s in sequences))
        self.pending += [(s,) for s in sequences]
        if len(self.pending) >= 1000:
            self._mode("NORMAL")
            self.db.executemany("DELETE FROM message WHERE sequence = ?", self.pending)
            self.db.commit()
            self.pending.clear()
            os.ftruncate(self.log, 0)


def serve_engine(port: int, store: str | None, with_proton: bool = False) -> None:
    db: Rows | None = None
    kind, _, path = (store or "").partition(":")
    if store and kind != "broker":
        db = LoggedRows(path) if kind == "log" else Rows(path)
    template = delivery_template()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        factory: Any = (lambda: ProtonEngine(template)) if with_proton else (lambda: Engine(template, db))
        if kind == "broker":  # oncebus's broker, with the queues bench/amqp_send.py's serve has
            from oncebus import Namespace, SqliteStore

            namespace = await Namespace.open(SqliteStore(Path(path) / "oncebus.db"))
            for queue in ("dedup-on", "receive"):
                await namespace.create_queue(queue, requires_duplicate_detection=True)
            factory = lambda: BrokerEngine(template, namespace)  # noqa: E731
        server = await loop.create_server(factory, "127.0.0.1", port)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    try:
        event_loop.run(main(), LOOP)  # the loop oncebus serve runs on
    except KeyboardInterrupt:  # the bench stops its servers with SIGINT
        pass


# ------------------------------------------------------------------------- proton: the same, on its reactor
def serve_proton(port: int) -> None:
    """A proton program: transfers accepted; deliveries made from one prepared message; completions settled."""
    from proton import Delivery, symbol
    from proton import Message as ProtonMessage
    from proton.reactor import Container

    class Floor(bench.sink_handler(port)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(auto_settle=True)
            self.sequence = 0
            self.message = ProtonMessage(id=str(uuid.uuid4()), body=bench.BODY, durable=True)

        def on_link_opening(self, event: Any) -> None:
            link = event.link
            link.snd_settle_mode = link.remote_snd_settle_mode  # as oncebus: the client's modes echoed
            link.rcv_settle_mode = link.remote_rcv_settle_mode
            super().on_link_opening(event)

        def on_sendable(self, event: Any) -> None:
            link = event.link
            if link.source.address == "$cbs":
                return
            message = self.message
            while link.credit > 0:
                self.sequence += 1
                message.annotations = {
                    symbol("x-opt-sequence-number"): self.sequence,
                    symbol("x-opt-locked-until"): int(time.time() * 1000) + 60_000,
                }
                link.send(message, tag=os.urandom(16))

        def on_accepted(self, event: Any) -> None:
            event.delivery.update(Delivery.ACCEPTED)  # the completion confirmed with its outcome
            event.delivery.settle()

    container = Container(Floor())
    container.allowed_mechs = "ANONYMOUS"
    try:
        container.run()
    except KeyboardInterrupt:
        pass


# ------------------------------------------------------------------------- the broker with no protocol
def sdk_batches(count: int, run: str, shape: str = "bare") -> list[bytes]:
    """The bytes the SDK's sender puts in a batch transfer (message format 0x80013700), ``bench.BATCH`` a batch of
    ``bench.bench_message``'s ``shape``."""
    from azure.servicebus._common.message import ServiceBusMessageBatch
    from azure.servicebus._pyamqp._encode import encode_payload
    from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

    batches = []
    for first in range(0, count, bench.BATCH):
        batch = ServiceBusMessageBatch(max_size_in_bytes=4 * 1024 * 1024, amqp_transport=PyamqpTransport)
        for i in range(first, min(first + bench.BATCH, count)):
            batch.add_message(bench.bench_message(shape, f"{run}-{i}"))
        out = bytearray()
        encode_payload(out, batch._message)
        batches.append(bytes(out))
    return batches


def broker_alone(count: int, senders: int, receivers: int, evict_kib: int = 0, shape: str = "bare") -> dict[str, float]:
    """Server CPU a message (this process, all threads) of oncebus's work with no protocol: decode + send, and
    receive + complete. Run in a fresh process (``--broker-alone``).

    ``evict_kib``: before each turn of completions, copy a buffer of that many KiB there and back, so the turn
    starts with the CPU's caches holding the copy rather than the broker's objects, as a server woken by each
    completion finds them on the wire (the kernel, the clients and the other thread ran meanwhile). The copies'
    own CPU is measured around them and not counted. ``shape``: ``bench.bench_message``'s, bare or realistic."""
    import resource

    from oncebus import Namespace, SqliteStore
    from oncebus.amqp import codec

    def cpu() -> float:
        used = resource.getrusage(resource.RUSAGE_SELF)
        return used.ru_utime + used.ru_stime

    batches = sdk_batches(count, "alone", shape)

    async def main(workdir: Path) -> dict[str, float]:
        namespace = await Namespace.open(SqliteStore(workdir / "oncebus.db"))
        await namespace.create_queue("q", requires_duplicate_detection=True)
        await asyncio.sleep(0.2)  # the queue's commit is out of the way

        async def sender(mine: list[bytes]) -> None:
            for payload in mine:
                await namespace.send("q", codec.decode_transfer(payload, BATCH_MESSAGE_FORMAT))

        started, loop_started = cpu(), time.thread_time()
        await asyncio.gather(*(sender(batches[i::senders]) for i in range(senders)))
        send_us = (cpu() - started) / count * 1e6
        send_loop_us = (time.thread_time() - loop_started) / count * 1e6
        await asyncio.sleep(1.0)  # the writer's background work after the sends (checkpoints) is not receive's
        loop = asyncio.get_running_loop()
        source, scratch = bytearray(evict_kib * 1024), bytearray(evict_kib * 1024)
        evicting = 0.0  # the copies' CPU (on this thread)
        started, loop_started = cpu(), time.thread_time()
        held: list[Any] = []
        taken = 0
        while taken < count or held:
            if len(held) < receivers and taken < count:
                got = await namespace.receive("q", 2 * bench.BATCH, max_wait_time=0)
                taken += len(got)
                held += got
            turn, held = held[:receivers], held[receivers:]
            if not turn:  # every send was acknowledged: an empty queue before the last one is a loss
                raise RuntimeError(f"the queue gave {taken} of the {count} messages sent")
            if evict_kib:
                copying = time.thread_time()
                scratch[:] = source
                source[:] = scratch
                evicting += time.thread_time() - copying
            outcomes: asyncio.Future[None] = loop.create_future()
            left = [len(turn)]

            def settled(
                error: BaseException | None, outcomes: asyncio.Future[None] = outcomes, left: list[int] = left
            ) -> None:
                if error is not None and not outcomes.done():
                    outcomes.set_exception(error)  # a completion that failed ends the bench, saying why
                left[0] -= 1
                if left[0] == 0 and not outcomes.done():
                    outcomes.set_result(None)

            for message in turn:
                namespace.complete_soon("q", message.lock_token, settled)
            await outcomes
        receive_us = (cpu() - started - evicting) / count * 1e6
        receive_loop_us = (time.thread_time() - loop_started - evicting) / count * 1e6
        await namespace.close()
        return {"send": send_us, "send_loop": send_loop_us, "receive": receive_us, "receive_loop": receive_loop_us}

    with tempfile.TemporaryDirectory(prefix="oncebus-alone-") as workdir:
        return event_loop.run(main(Path(workdir)), LOOP)


def necessary_parts(count: int) -> dict[str, float]:
    """Per message (``timeit``, best of 5), the send work no design can skip: reading each message of the SDK's
    batches (its id and properties are needed to judge and check it), checking the send, judging its key."""
    import timeit
    from datetime import timedelta

    from oncebus.amqp import codec
    from oncebus.core.dedup import DuplicateDetector
    from oncebus.core.entities import QueueProperties
    from oncebus.core.sending import validate_send

    batches = sdk_batches(min(count, 10 * bench.BATCH), "parts")
    decoded = [codec.decode_transfer(p, BATCH_MESSAGE_FORMAT) for p in batches]
    total = sum(len(unit) for unit in decoded)

    def best(work: Any, number: int = 20) -> float:
        return min(timeit.repeat(work, number=number, repeat=5)) / number / total * 1e6

    decode = best(lambda: [codec.decode_transfer(p, BATCH_MESSAGE_FORMAT) for p in batches])
    queue = QueueProperties(name="q", requires_duplicate_detection=True)
    window = timedelta(minutes=10)
    detector = DuplicateDetector(requires_duplicate_detection=True, window=window, partitioned=False)
    check = best(lambda: [validate_send(queue, detector, unit, scheduled=False) for unit in decoded])
    keys = [key for unit in decoded for key in validate_send(queue, detector, unit, scheduled=False).keys]
    clock = [1_800_000_000_000_000]

    def judge_new_keys() -> None:  # each round a fresh detector: every key is new, as in the send rows
        fresh = DuplicateDetector(requires_duplicate_detection=True, window=window, partitioned=False)
        clock[0] += 1_000
        for key in keys:
            assert key is not None
            fresh.judge(key, clock[0])

    judge = best(judge_new_keys)
    return {"decode": decode, "check": check, "judge": judge}


def run_broker_alone(
    count: int, senders: int, receivers: int, evict_kib: int = 0, shape: str = "bare"
) -> dict[str, float]:
    command = [sys.executable, __file__, "--broker-alone", str(count), "--senders", str(senders)]
    command += ["--receivers", str(receivers), "--evict-kib", str(evict_kib), "--shape", shape]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def start(kind: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = bench.free_port()
    command = [sys.executable, __file__, f"--serve-{kind}", str(port), *extra]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "ready":
            break
    bench.wait_for_port(port, process, kind)
    key = "a" * 44
    return (
        process,
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey={key};UseDevelopmentEmulator=true",
    )


def stop(servers: dict[str, tuple[subprocess.Popen[Any], str]]) -> None:
    """Stop the servers still running (SIGINT, as their loops expect; killed after 30 s)."""
    running = [process for process, _ in servers.values() if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGINT)
    for process in running:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per measurement (default 20000)")
    parser.add_argument("--senders", type=int, default=2, help="concurrent sender processes (default 2)")
    parser.add_argument("--receivers", type=int, default=4, help="concurrent receiver processes (default 4)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each measurement; the best is shown")
    parser.add_argument("--no-receive", action="store_true", help="send rows only")
    parser.add_argument("--no-send", action="store_true", help="receive + complete rows only")
    parser.add_argument("--serve-engine", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-proton", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--with-proton", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--broker-alone", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--evict-kib", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=("bare", "realistic"), default="bare", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.broker_alone:
        measured = broker_alone(args.broker_alone, args.senders, args.receivers, args.evict_kib, args.shape)
        print(json.dumps(measured | necessary_parts(args.broker_alone)))
        return
    if args.serve_engine:
        serve_engine(args.serve_engine, args.store, args.with_proton)
        return
    if args.serve_proton:
        serve_proton(args.serve_proton)
        return
    count, senders, receivers = args.messages, args.senders, args.receivers
    print(f"before: {bench.load()}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-floor-"))
    servers: dict[str, tuple[subprocess.Popen[Any], str]] = {}
    rows: dict[str, list[bench.Measured]] = collections.defaultdict(list)
    alone: list[dict[str, float]] = []
    one_a_turn: dict[tuple[str, int], list[float]] = collections.defaultdict(list)  # by (shape, KiB evicted)
    try:
        servers["oncebus"] = bench.start_oncebus(workdir)
        servers["proton"] = start("proton")
        servers["proton-asyncio"] = start("engine", "--with-proton")
        servers["engine"] = start("engine")
        servers["engine+sqlite"] = start("engine", "--store", f"sqlite:{workdir / 'engine.db'}")
        servers["engine+log"] = start("engine", "--store", f"log:{workdir / 'logged.db'}")
        (workdir / "broker").mkdir()
        servers["engine+broker"] = start("engine", "--store", f"broker:{workdir / 'broker'}")
        started = bench.start_nats(workdir, sync_always=True)
        if isinstance(started, str):
            print(f"JetStream not measured: {started}")
        else:
            servers["jetstream"] = (started[0], str(started[1]))
        per_receiver = (count + receivers - 1) // receivers
        for r in range(args.repeat):
            for name, (process, string) in servers.items():
                if name == "jetstream":
                    port = int(string)
                    if not args.no_send:
                        jobs = [(port, f"r{r}", share) for share in bench._shares(count, senders)]
                        rows[f"send {name}"].append(bench.run_workers(bench.jetstream_sender, jobs, process.pid))
                    if not args.no_receive:
                        bench.jetstream_fill(port, f"r{r}", count)
                        jobs = [(port, per_receiver)] * receivers
                        rows[f"receive {name}"].append(bench.run_workers(bench.jetstream_receiver, jobs, process.pid))
                    continue
                if not args.no_send:
                    queue = "dedup-on" if name in ("oncebus", "engine+broker") else "sink"
                    jobs = [(string, queue, f"r{r}", "bare", share) for share in bench._shares(count, senders)]
                    rows[f"send {name}"].append(bench.run_workers(bench.sdk_sender, jobs, process.pid))
                    if name in ("proton", "oncebus", "engine+broker"):  # the message applications send, and the bare
                        jobs = [(string, queue, f"r{r}-real", "realistic", n) for n in bench._shares(count, senders)]
                        rows[f"realistic {name}"].append(bench.run_workers(bench.sdk_sender, jobs, process.pid))
                if not args.no_receive:
                    if name in ("oncebus", "engine+broker"):
                        bench.sdk_fill(string, "receive", f"r{r}", count)
                    jobs = [(string, "receive", per_receiver)] * receivers
                    rows[f"receive {name}"].append(bench.run_workers(bench.sdk_receiver, jobs, process.pid))
        stop(servers)  # nothing else runs beside the broker alone
        alone = [run_broker_alone(count, senders, receivers) for _ in range(args.repeat)]
        for _ in range(args.repeat):  # one completion a turn, the caches warm and evicted, alternated
            for shape in ("bare", "realistic"):
                for evict in (0, EVICT_KIB):
                    one_a_turn[shape, evict].append(run_broker_alone(count, senders, 1, evict, shape)["receive"])
    finally:
        stop(servers)
        shutil.rmtree(workdir, ignore_errors=True)
    got = {name: bench.best(measured) for name, measured in rows.items()}
    titles = {
        "proton": "proton reactor (stores nothing)",
        "proton-asyncio": "proton on asyncio, as oncebus (nothing)",
        "engine": "python engine (stores nothing)",
        "engine+sqlite": "python engine + SQLite rows",
        "engine+log": "python engine + rows, settlement log",
        "engine+broker": "python engine + oncebus's broker",
        "oncebus": "oncebus serve (dedup on)",
        "jetstream": "JetStream, sync always (ack_sync)",
    }
    for what, label in (
        ("send", f"send ({count:,} x 1 KiB, batches of {bench.BATCH}, {senders} senders)"),
        ("receive", f"receive + complete ({count:,}, {receivers} PEEK_LOCK receivers)"),
    ):
        if f"{what} oncebus" not in got:
            continue
        print(f"{label}; best of {args.repeat}")
        for name, title in titles.items():
            if f"{what} {name}" in got:
                print(f"  {title:<40} {bench.describe(got[f'{what} {name}'])}")
        engine, proton, oncebus = got[f"{what} engine"], got[f"{what} proton-asyncio"], got[f"{what} oncebus"]
        print(f"  ratio python engine / proton on asyncio, msg/s:     {engine.rate / proton.rate:6.2f}")
        if engine.server_cpu_us and proton.server_cpu_us:
            cpu = proton.server_cpu_us / engine.server_cpu_us
            print(f"  server CPU a message, proton on asyncio / engine: {cpu:6.2f}")
        print(f"  ratio oncebus / python engine, msg/s:             {oncebus.rate / engine.rate:6.2f}")
        print(f"  ratio oncebus / proton on asyncio, msg/s:         {oncebus.rate / proton.rate:6.2f}")
        for name in ("engine", "engine+log", "engine+broker", "oncebus"):
            if what == "receive" and "receive jetstream" in got:
                ratio = got[f"receive {name}"].rate / got["receive jetstream"].rate
                print(f"  ratio {titles[name].split(' (')[0]} / JetStream, msg/s: {ratio:6.2f}")
    if "realistic oncebus" in got and "realistic proton" in got:
        real, sink = got["realistic oncebus"], got["realistic proton"]
        print("send, the realistic message (subject, content type, correlation id, 4 application properties)")
        print(f"  {titles['proton']:<40} {bench.describe(sink)}")
        print(f"  {titles['oncebus']:<40} {bench.describe(real)}")
        lean = got.get("realistic engine+broker")
        if lean is not None:
            print(f"  {titles['engine+broker']:<40} {bench.describe(lean)}")
        print(f"  ratio oncebus / proton reactor, msg/s:            {real.rate / sink.rate:6.2f}")
        if lean is not None:
            print(f"  ratio python engine + oncebus's broker / proton reactor, msg/s: {lean.rate / sink.rate:6.2f}")
    if alone:
        best_alone = {key: min(run[key] for run in alone) for key in alone[0]}
        print(f"the broker alone, in process (no protocol; best of {len(alone)}), server CPU a message:")
        for what, title in (("send", "send (decode + judge + store)"), ("receive", "receive + complete")):
            print(f"  {title:<30} {best_alone[what]:6.1f} us (loop thread {best_alone[what + '_loop']:.1f})")
        for shape in ("bare", "realistic"):
            if one_a_turn[shape, 0] and one_a_turn[shape, EVICT_KIB]:
                warm, cold = min(one_a_turn[shape, 0]), min(one_a_turn[shape, EVICT_KIB])
                print(
                    f"  receive + complete, {shape}, one completion a turn: {warm:.1f} us; with {EVICT_KIB} KiB "
                    f"copied before each turn (the caches as a wake-up on the wire finds them; the copy not counted): "
                    f"{cold:.1f} us ({cold / warm:.2f}x)"
                )
        print("what the goals would have to hold: the engine that stores nothing + the broker alone")
        for what, goal in (("send", SEND_GOAL_US), ("receive", RECEIVE_GOAL_US)):
            bare = got.get(f"{what} engine")
            served_by = got.get(f"{what} oncebus")
            if bare is None or bare.server_cpu_us is None:
                continue
            floor = bare.server_cpu_us + best_alone[what]
            served = ""
            if served_by is not None and served_by.server_cpu_us is not None:
                served = f"; oncebus serve {served_by.server_cpu_us:.1f}"
            print(
                f"  {what:<8} {bare.server_cpu_us:5.1f} + {best_alone[what]:5.1f} = {floor:6.1f} us against the "
                f"goal's {goal:.0f} (floor / goal {floor / goal:4.2f}{served})"
            )
        send_rows = got.get("send engine+sqlite")
        if send_rows is not None and send_rows.server_cpu_us is not None:
            parts = send_rows.server_cpu_us + best_alone["decode"] + best_alone["check"] + best_alone["judge"]
            print(
                "  send's necessary parts: the engine storing rows (one a message, fsync a batch) "
                f"{send_rows.server_cpu_us:.1f} + reading each message {best_alone['decode']:.1f} + checking "
                f"{best_alone['check']:.1f} + judging {best_alone['judge']:.1f} = {parts:.1f} us against "
                f"{SEND_GOAL_US:.0f}"
            )
        receive_log = got.get("receive engine+log")
        if receive_log is not None and receive_log.server_cpu_us is not None:
            print(
                "  receive's necessary parts: the engine delivering from a template, each completion an 8-byte "
                f"log record {receive_log.server_cpu_us:.1f} us against {RECEIVE_GOAL_US:.0f}, before any broker work"
            )
        lean = got.get("receive engine+broker")
        if lean is not None and lean.server_cpu_us is not None:
            print(
                f"  measured, not summed: that engine over oncebus's broker {lean.server_cpu_us:.1f} us against "
                f"{RECEIVE_GOAL_US:.0f} (oncebus serve {got['receive oncebus'].server_cpu_us or 0:.1f})"
            )
    print(f"after: {bench.load()}")


if __name__ == "__main__":
    main()
