"""The frame scanner and the engine on one transfer, in-process (issue 34 item 1: one pass over each frame).

A client session is fed to ``oncebus.amqp.engine.Connection`` (header, open, begin, a sender link with credit),
then ``--transfers`` transfers, each holding one realistic message as the Python SDK encodes it
(``bench/amqp_send.py``'s: a 1 KiB body, a subject, a content type, a correlation id and four application
properties). For each, what a send link does short of the broker: the bytes go through the scanner (bounds,
each performative decoded once) into the engine (session and link state, a delivery event), the payload is read
and the delivery accepted and settled (its disposition written). No socket, no codec, no broker: this is the
door's per-transfer cost before the message is decoded. Prints microseconds a transfer (process CPU clock,
best of ``--repeat`` rounds).

Usage: ``python bench/amqp_frames.py [--transfers 20000] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import struct
import time
from typing import Any

from azure.servicebus._pyamqp._encode import encode_frame, encode_payload
from azure.servicebus._pyamqp.endpoints import Source, Target
from azure.servicebus._pyamqp.message import Message, Properties
from azure.servicebus._pyamqp.performatives import AttachFrame, BeginFrame, OpenFrame, TransferFrame

from oncebus.amqp import engine, events

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"


def _frame(performative: Any) -> bytes:
    header, body = encode_frame(performative, b"\x00")
    return header + struct.pack(">H", 0) + bytes(body or b"")


def _payload() -> bytes:
    body = bytearray()
    properties = Properties(
        message_id="m", subject="order-created", content_type="application/json", correlation_id="corr-m"
    )
    application = {"tenant": "contoso", "attempt": 1, "priority": True, "amount": 9.5}
    encode_payload(body, Message(data=[b"x" * 1024], properties=properties, application_properties=application))
    return bytes(body)


def _serve(conn: engine.Connection) -> None:
    """Open what the client opens (what the connection's handlers do, in short)."""
    collector = conn.collector
    assert collector is not None
    while (event := collector.peek()) is not None:
        if isinstance(event, events.SessionBegun):
            event.session.open()
        elif isinstance(event, events.LinkAttached):
            link = event.link
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)
            link.max_message_size = 1 << 20
            link.open()
            link.flow(1 << 30)
        collector.pop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=20000, help="transfers per round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best is shown")
    args = parser.parse_args()
    payload = _payload()
    conn = engine.Connection()
    conn.collect(engine.Collector())
    conn.open()
    attach = AttachFrame(
        "s", 0, False, 0, 0, Source(address=None), Target(address="q"), None, None, 0, None, None, None, None
    )
    conn.receive_data(
        AMQP_HEADER
        + _frame(OpenFrame("bench", None, 65536, 255, None, None, None, None, None, None))
        + _frame(BeginFrame(None, 0, 5000, 5000, 64, None, None, None))
        + _frame(attach)
    )
    _serve(conn)
    conn.take_output()
    link = conn.links[0]
    count = args.transfers
    frames = [
        _frame(TransferFrame(0, i, b"%d" % i, 0, None, False, None, None, None, None, None, payload))
        for i in range(count * args.repeat)
    ]
    best = float("inf")
    for round_ in range(args.repeat):
        start = time.process_time()
        for data in frames[round_ * count : (round_ + 1) * count]:
            conn.receive_data(data)
            delivery = link.current
            assert delivery is not None
            link.recv(1 << 20)
            link.advance()
            delivery.update(engine.ACCEPTED)
            delivery.settle()
            conn.collector.events.clear()  # type: ignore[union-attr]
            conn.take_output()
        best = min(best, (time.process_time() - start) / count * 1e6)
    print(f"scanner + engine, one realistic transfer read and accepted: {best:.2f} us (best of {args.repeat})")


if __name__ == "__main__":
    main()
