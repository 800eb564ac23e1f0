"""A raw-socket AMQP 1.0 client for hostile-client tests: every byte is the test's to choose.

Frames are built and read with the azure-servicebus SDK's own codec (``_pyamqp``),
so well-formed frames look exactly like the SDK's; the tests then break them.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any

from azure.servicebus._pyamqp._decode import decode_frame, decode_payload
from azure.servicebus._pyamqp._encode import encode_frame, encode_payload
from azure.servicebus._pyamqp.endpoints import Source, Target
from azure.servicebus._pyamqp.message import Message, Properties
from azure.servicebus._pyamqp.performatives import (
    AttachFrame,
    BeginFrame,
    FlowFrame,
    OpenFrame,
    SASLInit,
    TransferFrame,
)

from oncebus.amqp.sas import DEFAULT_KEY, DEFAULT_KEY_NAME, make_token

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
SASL_MECHANISMS, SASL_OUTCOME = 0x40, 0x44


def frame(performative: Any, channel: int = 0, frame_type: bytes = b"\x00") -> bytes:
    header, body = encode_frame(performative, frame_type)
    return header + struct.pack(">H", channel) + bytes(body or b"")


def raw_frame(body: bytes, channel: int = 0, *, frame_type: int = 0, doff: int = 2) -> bytes:
    """A frame around any ``body`` (the header says ``8 + len(body)`` bytes)."""
    return struct.pack(">IBBH", 8 + len(body), doff, frame_type, channel) + body


def encoded(message: Message) -> bytes:
    out = bytearray()
    encode_payload(out, message)
    return bytes(out)


def open_frame(container: str = "raw-client", max_frame_size: int = 65536) -> bytes:
    return frame(OpenFrame(container, None, max_frame_size, 255, None, None, None, None, None, None))


def attach_frame(name: str, handle: int, address: str, *, sender: bool, channel: int = 0, **fields: Any) -> bytes:
    values: dict[str, Any] = {
        "name": name,
        "handle": handle,
        "role": not sender,
        "send_settle_mode": 0,
        "rcv_settle_mode": 0,
        "source": Source(address=None if sender else address),
        "target": Target(address=address if sender else None),
        "unsettled": None,
        "incomplete_unsettled": None,
        "initial_delivery_count": 0 if sender else None,
        "max_message_size": None,
        "offered_capabilities": None,
        "desired_capabilities": None,
        "properties": None,
    }
    values.update(fields)
    return frame(AttachFrame(**values), channel)


def transfer_frame(handle: int, payload: bytes, channel: int = 0, **fields: Any) -> bytes:
    values: dict[str, Any] = {
        "handle": handle,
        "delivery_id": None,
        "delivery_tag": None,
        "message_format": None,
        "settled": None,
        "more": False,
        "rcv_settle_mode": None,
        "state": None,
        "resume": None,
        "aborted": None,
        "batchable": None,
        "payload": payload,
    }
    values.update(fields)
    return frame(TransferFrame(**values), channel)


def flow_frame(handle: int, credit: int, channel: int = 0, *, incoming_window: int = 65536) -> bytes:
    return frame(FlowFrame(0, incoming_window, 0, 65536, handle, 0, credit, None, None, None, None), channel)


@dataclass
class Frame:
    channel: int
    frame_type: int
    code: int | None  # the performative (None for an empty frame)
    fields: list[Any]
    body: bytes = b""  # the frame's body as sent (the codec above drops descriptors it does not know)


class RawClient:
    """One TCP connection to the server, with helpers for the usual steps."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buffer = b""
        self.headers: list[bytes] = []
        self.eof = False
        self.next_delivery_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> bool:
        if self.eof:
            return False
        self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionResetError:
            self.eof = True
            return False
        if not chunk:
            self.eof = True
            return False
        self.buffer += chunk
        return True

    def read_frame(self, timeout: float | None = None) -> Frame | None:
        """The next frame (protocol headers are collected in ``headers``); None at end of stream or timeout."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if self.buffer[:4] == b"AMQP" and len(self.buffer) >= 8:
                self.headers.append(self.buffer[:8])
                self.buffer = self.buffer[8:]
                continue
            if len(self.buffer) >= 8 and self.buffer[:4] != b"AMQP":
                size, doff, frame_type, channel = struct.unpack(">IBBH", self.buffer[:8])
                if len(self.buffer) >= size:
                    body = self.buffer[doff * 4 : size]
                    self.buffer = self.buffer[size:]
                    if not body:
                        return Frame(channel, frame_type, None, [])
                    code, fields = decode_frame(memoryview(body))
                    return Frame(channel, frame_type, code, list(fields), bytes(body))
            if not self._fill(deadline):
                return None

    def expect(self, code: int, timeout: float | None = None) -> Frame:
        """Read frames until one with performative ``code``; fail on end of stream."""
        seen = []
        while True:
            got = self.read_frame(timeout)
            if got is None:
                raise AssertionError(f"no frame 0x{code:02x} before the end (saw {seen}, eof={self.eof})")
            if got.code == code:
                return got
            seen.append(got.code if got.code != 0x18 else (got.code, got.fields))  # a close: with its error

    def frames_until_closed(self, timeout: float = 10.0) -> list[Frame]:
        """Every frame until the server closes the socket; fails if it does not within ``timeout``."""
        frames = []
        deadline = time.monotonic() + timeout
        while True:
            got = self.read_frame(max(deadline - time.monotonic(), 0.01))
            if got is None:
                assert self.eof, f"the server did not close the socket within {timeout} s (frames {frames})"
                return frames
            frames.append(got)

    # --- the usual steps -----------------------------------------------------------------------
    def handshake(self, *, begin: bool = True) -> None:
        """SASL ANONYMOUS, open, and (optionally) a session on channel 0."""
        self.send(SASL_HEADER)
        self.expect(SASL_MECHANISMS)
        self.send(frame(SASLInit(b"ANONYMOUS", None, None), frame_type=b"\x01"))
        outcome = self.expect(SASL_OUTCOME)
        assert outcome.fields[0] == 0, outcome
        self.send(AMQP_HEADER + open_frame())
        self.expect(OPEN)
        if begin:
            self.send(frame(BeginFrame(None, 0, 65536, 65536, 1023, None, None, None)))
            self.expect(BEGIN)

    def put_token(self, entity: str, *, expiry: int | None = None, handles: tuple[int, int] = (100, 101)) -> int:
        """Authorise ``entity`` through $cbs; returns the status code."""
        sender, receiver = handles
        self.send(attach_frame(f"cbs-sender-{sender}", sender, "$cbs", sender=True))
        self.send(attach_frame(f"cbs-receiver-{receiver}", receiver, "$cbs", sender=False))
        self.send(flow_frame(receiver, 10))
        self.expect(ATTACH)
        self.expect(ATTACH)
        audience = f"sb://127.0.0.1:{self.port}/{entity}"
        token = make_token(audience, DEFAULT_KEY_NAME, DEFAULT_KEY, expiry or int(time.time()) + 3600)
        request = Message(
            value=token,
            properties=Properties(message_id=str(uuid.uuid4()), reply_to=f"cbs-receiver-{receiver}"),
            application_properties={
                "operation": "put-token",
                "type": "servicebus.windows.net:sastoken",
                "name": audience,
                "expiration": expiry or int(time.time()) + 3600,
            },
        )
        self.transfer(sender, encoded(request))
        got = self.expect(TRANSFER)  # the answer, on the link from $cbs (the only one sending to us)
        response = decode_payload(memoryview(got.fields[-1]))
        status = response.application_properties[b"status-code"]
        return int(status)

    def transfer(self, handle: int, payload: bytes, *, tag: bytes | None = None, **fields: Any) -> int:
        delivery_id = self.next_delivery_id
        self.next_delivery_id += 1
        self.send(
            transfer_frame(
                handle,
                payload,
                delivery_id=delivery_id,
                delivery_tag=tag or uuid.uuid4().bytes,
                message_format=fields.pop("message_format", 0),
                **fields,
            )
        )
        return delivery_id

    def attach_sender(self, entity: str, handle: int = 1) -> Frame:
        """Attach a sender to ``entity`` (authorised first) and wait for the server's attach and credit."""
        self.send(attach_frame(f"sender-{handle}", handle, entity, sender=True))
        attach = self.expect(ATTACH)
        self.expect(FLOW)
        return attach

    def disposition(self, delivery_id: int, timeout: float | None = None) -> Frame:
        """The server's outcome for our delivery ``delivery_id``."""
        while True:
            got = self.expect(DISPOSITION, timeout)
            first, last = got.fields[1], got.fields[2]
            if first <= delivery_id <= (last if last is not None else first):
                return got


def error_of(got: Frame) -> tuple[str, str]:
    """(condition, description) of a close/detach frame's error."""
    error = got.fields[-1]
    assert error is not None, f"no error in {got}"
    condition, description = error[0], error[1]
    return (
        condition.decode() if isinstance(condition, bytes) else str(condition),
        description.decode() if isinstance(description, bytes) else str(description),
    )


def outcome_of(disposition: Frame) -> tuple[str, str | None, str | None]:
    """(outcome name, error condition, error description) of a disposition frame's state."""
    state = disposition.fields[4]
    assert isinstance(state, dict) and len(state) == 1, state
    name, value = next(iter(state.items()))
    error = value[0] if name == "rejected" and value and value[0] else None
    if error is None:
        return name, None, None
    return name, bytes(error[0]).decode(), bytes(error[1]).decode()


def vmrss_kib(pid: int) -> int:
    """The resident memory of process ``pid`` in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")
