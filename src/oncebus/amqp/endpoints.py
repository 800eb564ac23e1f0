"""What the connection's, sessions' and links' state machines share (AMQP 1.0 part 2), without I/O.

The numbers (endpoint state bits, settle modes, outcome codes, terminus types) are proton's, so the handlers
written for proton's engine read the same; the rare maps and conditions are encoded with proton's value types.
Here too: the termini (:class:`Terminus`), a side's delivery state (:class:`Disposition`), what a link handler
notes about a delivery (:class:`DeliveryNotes`), the :class:`ProtocolError` a state machine raises where the
client broke the protocol. The state machines themselves: :mod:`oncebus.amqp.link_state` (links and
deliveries), :mod:`oncebus.amqp.session_state` (sessions, which own their links), :mod:`oncebus.amqp.engine`
(the connection, which owns its sessions).
"""

from __future__ import annotations

import uuid
from typing import Any

import proton

from oncebus.amqp.encoding import NULL, Reader, encode_list, encode_string, encode_symbol

# proton's numbers (tested equal in tests/amqp/test_engine.py): handlers compare with proton's constants
LOCAL_UNINIT, LOCAL_ACTIVE, LOCAL_CLOSED = 1, 2, 4
REMOTE_UNINIT, REMOTE_ACTIVE, REMOTE_CLOSED = 8, 16, 32
SND_UNSETTLED, SND_SETTLED, SND_MIXED = 0, 1, 2
RCV_FIRST, RCV_SECOND = 0, 1
RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED = 0x23, 0x24, 0x25, 0x26, 0x27
UNSPECIFIED, SOURCE, TARGET, COORDINATOR = 0, 1, 2, 3
_SOURCE_CODE, _TARGET_CODE, _COORDINATOR_CODE, _ERROR_CODE = 0x28, 0x29, 0x30, 0x1D
TRUE, FALSE = b"\x41", b"\x42"
_ACCEPTED_STATE = b"\x00\x53\x24\x45"
_ACCEPTED_CODE = proton.ulong(ACCEPTED)
_RELEASED_STATE = b"\x00\x53\x26\x45"
_EMPTY_MAP = b"\xc1\x01\x00"

Condition = proton.Condition


def encode_value(value: Any) -> bytes:
    """Any value proton's types describe, AMQP-encoded (by proton's codec: the rare frames' maps and states)."""
    data = proton.Data()
    data.put_object(value)
    return bytes(data.encode())


def error_encoding(condition: Condition | None) -> bytes:
    """An ``error`` from a proton ``Condition`` (its info map always present: the SDK reads it by position)."""
    if condition is None:
        return NULL
    info = encode_value(dict(condition.info)) if isinstance(condition.info, dict) and condition.info else _EMPTY_MAP
    description = encode_string(condition.description) if condition.description is not None else NULL
    return b"\x00\x53\x1d" + encode_list([encode_symbol(condition.name), description, info])


def condition_of_error(value: Any) -> Condition | None:
    """A proton ``Condition`` from a decoded ``error`` (None for none)."""
    if not isinstance(value, proton.Described) or not isinstance(value.value, list):
        return None
    fields = [*list(value.value), None, None, None]
    name, description, info = fields[0], fields[1], fields[2]
    return proton.Condition(
        str(name or ""), description if isinstance(description, str) else None, info if isinstance(info, dict) else None
    )


class ProtocolError(Exception):
    """The client broke the protocol: the engine closes the connection with ``condition`` and ``description``."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


# ------------------------------------------------------------------------------------- termini
class Terminus:
    """A link's source or target: kept as the bytes the client sent, which the answer echoes."""

    def __init__(self, kind: int) -> None:
        self.type = kind
        self.raw: bytes = NULL  # the encoded source / target (a described list), or null
        self.address: str | None = None
        self._filter: dict[Any, Any] | None = None  # a replaced filter (a source's field 7)
        self._received_filter: dict[Any, Any] = {}  # the filter the client sent

    @classmethod
    def received(cls, raw: bytes, value: Any, default: int) -> Terminus:
        """The client's terminus: its bytes as sent (``raw``) and as the frame scanner decoded them (``value``)."""
        terminus = cls(UNSPECIFIED)
        terminus.raw = raw
        if not isinstance(value, proton.Described):
            return terminus
        code = int(value.descriptor) if isinstance(value.descriptor, int) else -1
        terminus.type = {_SOURCE_CODE: SOURCE, _TARGET_CODE: TARGET, _COORDINATOR_CODE: COORDINATOR}.get(code, default)
        fields = value.value if isinstance(value.value, list) else []
        if terminus.type != COORDINATOR:
            address = fields[0] if fields else None
            terminus.address = str(address) if isinstance(address, str) else None
        if terminus.type == SOURCE:
            filters = fields[7] if len(fields) > 7 else None
            terminus._received_filter = dict(filters) if isinstance(filters, dict) else {}
        return terminus

    def copy(self, other: Terminus) -> None:
        self.type, self.raw, self.address, self._filter = other.type, other.raw, other.address, other._filter
        self._received_filter = other._received_filter

    def filter_map(self) -> dict[Any, Any]:
        """The source's filter set (empty when none)."""
        return dict(self._filter if self._filter is not None else self._received_filter)

    def set_filter(self, filters: dict[Any, Any]) -> None:
        self._filter = dict(filters)

    def encode(self) -> bytes:
        if self.type == UNSPECIFIED:
            return NULL
        if self._filter is None or self.raw[:1] != b"\x00":
            return self.raw
        reader = Reader(self.raw)
        reader.descriptor()
        head = self.raw[: reader.pos]
        spans = reader.field_spans()
        fields = [self.raw[a:b] for a, b in spans] + [NULL] * max(0, 8 - len(spans))
        fields[7] = encode_value(self._filter)
        return head + encode_list(fields)


class Disposition:
    """One side's delivery state (proton's ``Disposition``: condition, data, failed, undeliverable).

    Its defaults are the class's (no ``__init__``: two are made for every delivery, and Python runs none)."""

    type = 0
    condition: Condition | None = None
    data: list[Any] | None = None
    failed = False
    undeliverable = False
    annotations: Any = None

    def encode(self, state: int) -> bytes:
        if state == ACCEPTED:
            return _ACCEPTED_STATE
        if state == RELEASED:
            return _RELEASED_STATE
        if state == REJECTED:
            return b"\x00\x53\x25" + encode_list([error_encoding(self.condition)])
        if state == MODIFIED:
            annotations = encode_value(self.annotations) if self.annotations else NULL
            return b"\x00\x53\x27" + encode_list(
                [TRUE if self.failed else FALSE, TRUE if self.undeliverable else FALSE, annotations]
            )
        if state == 0:
            return NULL
        return encode_value(proton.Described(proton.ulong(state), list(self.data or [])))

    def decode(self, value: Any) -> int:
        """Read a decoded delivery state; its code (0: none)."""
        if not isinstance(value, proton.Described):
            return 0
        code = int(value.descriptor) if isinstance(value.descriptor, int) else 0
        fields = value.value if isinstance(value.value, list) else []
        if code == REJECTED:
            self.condition = condition_of_error(fields[0]) if fields else None
        elif code == MODIFIED:
            self.failed = bool(fields[0]) if fields else False
            self.undeliverable = bool(fields[1]) if len(fields) > 1 else False
            self.annotations = fields[2] if len(fields) > 2 else None
        elif code not in (ACCEPTED, RELEASED):
            self.data = list(fields)
        self.type = code
        return code


# ------------------------------------------------------------------------------------- endpoints
class DeliveryNotes:
    """What oncebus's link handlers keep about one delivery while they work on it (defaults are the class's: no
    ``__init__`` runs for the one every delivery has)."""

    done = False  # its outcome was given (nothing more is said about it)
    refused = False  # refused while still arriving (its bytes were dropped)
    settling = False  # the client's settlement is being applied
    txn_id: bytes | None = None  # the transaction that holds it (a transactional-state on its transfer)
    lock_token: uuid.UUID | None = None  # the lock of the message it carries (oncebus sends it)


class Endpoint:
    def __init__(self) -> None:
        self.local = LOCAL_UNINIT
        self.remote_bits = REMOTE_UNINIT
        self.condition: Condition | None = None
        self.remote_condition: Condition | None = None

    @property
    def state(self) -> int:
        return self.local | self.remote_bits
