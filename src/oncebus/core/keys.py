"""The dedup key: what two sends must share to be duplicates.

Not partitioned: ``message_id`` alone. Partitioned: ``(partition_key,
message_id)`` where the partition key is the message's ``partition_key``,
else its ``session_id``, else its ``message_id``. Nothing else counts.

A message id is any AMQP ``message-id``: a string, binary, a UUID or a ulong
(:data:`MessageId`). Two different ids never make the same key: the key's text
keeps each id's type. A string id is its own text (so keys stored by earlier
releases keep their meaning); the other types get a text starting with a NUL
character, which a string id starting with NUL is escaped to avoid:

=========================  ==========================
id                         text in the key
=========================  ==========================
``"order-1"``              ``order-1``
``"\\x00odd"``              ``\\x00s\\x00odd``
``b"\\x01\\xff"``             ``\\x00b01ff``
``UUID("12345678-...")``   ``\\x00u12345678-...``
``42`` (ulong)             ``\\x00i42``
=========================  ==========================
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from oncebus.core.errors import InvalidArgumentError, InvalidOperationError

MessageId = str | bytes | uuid.UUID | int
"""An AMQP message-id: string, binary, uuid or ulong (``int`` from 0 to 2**64 - 1)."""

MAX_ID_LENGTH = 128
MAX_BINARY_ID_BYTES = MAX_ID_LENGTH // 2  # its Service Bus text (hex) is at most 128 characters
ULONG_MAX = 2**64 - 1
_MASK64 = 0xFFFFFFFFFFFFFFFF
_TAG = "\x00"

ID_TYPES = {str: "string", bytes: "binary", uuid.UUID: "uuid", int: "ulong"}


@dataclass(frozen=True)
class DedupKey:
    """A dedup key; ``text`` is its canonical, unambiguous encoding (stored durably)."""

    message_id: MessageId
    partition_key: MessageId | None

    @property
    def text(self) -> str:
        return key_text(self.message_id, self.partition_key)

    @property
    def digest(self) -> tuple[int, int]:
        return key_digest(self.text)


def id_text(value: MessageId) -> str:
    """The one-to-one text of an id (see the module's table): a string stays itself unless it starts with NUL."""
    if isinstance(value, str):
        return value if not value.startswith(_TAG) else _TAG + "s" + value
    if isinstance(value, bytes):
        return _TAG + "b" + value.hex()
    if isinstance(value, uuid.UUID):
        return _TAG + "u" + str(value)
    return _TAG + "i" + str(value)


def id_type(value: MessageId) -> str:
    """``string``, ``binary``, ``uuid`` or ``ulong``."""
    for kind, name in ID_TYPES.items():
        if isinstance(value, kind) and not isinstance(value, bool):
            return name
    raise InvalidArgumentError(f"{type(value).__name__} is not a message id type")


def service_bus_text(value: MessageId) -> str:
    """The id as Service Bus shows a non-string id as text (.NET ``MessageId.ToString()``): binary in upper-case
    hex, a UUID in its 8-4-4-4-12 form, a ulong in decimal. Not one-to-one across types: for display only."""
    if isinstance(value, bytes):
        return value.hex().upper()
    return str(value)


def key_text(message_id: MessageId, partition_key: MessageId | None) -> str:
    """The canonical text of a key; ``partition_key`` is None on entities that are not partitioned."""
    if partition_key is None:
        return id_text(message_id)
    pk = id_text(partition_key)
    # length prefix keeps (pk, id) pairs apart whatever characters they hold
    return f"{len(pk)}:{pk}{id_text(message_id)}"


def keyed_digest(secret: bytes) -> Callable[[str], tuple[int, int]]:
    """A 128-bit digest of a key's text for the in-memory index, as two 64-bit halves: BLAKE2b keyed with
    ``secret`` (16 bytes), so nobody who does not know it can choose ids that collide in the index's table.

    The same secret gives the same digests in every process: an index written to disk at shutdown
    (``DedupIndex.dump``) keeps its secret and is read back as it is. A false duplicate needs two keys
    colliding on all 128 bits: about 1 in 10^24 for ten million keys held.
    """
    copy = hashlib.blake2b(digest_size=16, key=secret).copy
    from_bytes = int.from_bytes

    def digest(text: str) -> tuple[int, int]:
        h = copy()
        h.update(text.encode("utf-8", "surrogatepass"))
        value = from_bytes(h.digest(), "little")
        return value >> 64, value & _MASK64

    return digest


DIGEST_SECRET = os.urandom(16)  # this process's, for indexes not read from disk
key_digest = keyed_digest(DIGEST_SECRET)


def utf16_length(text: str) -> int:
    """The length of ``text`` as Service Bus (.NET strings) counts it: UTF-16 code units, two per astral character."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _check_length(name: str, value: str) -> None:
    length = utf16_length(value)
    if length > MAX_ID_LENGTH:
        units = f"{len(value)} characters" if length == len(value) else f"{length} UTF-16 code units"
        raise InvalidArgumentError(
            f"{name} is {units} long; at most {MAX_ID_LENGTH} are allowed (counted in UTF-16 code units, as "
            "Service Bus counts them: a character outside the Basic Multilingual Plane, such as an emoji, counts 2)"
        )


def normalize_message_id(value: object, *, name: str = "message_id") -> MessageId:
    """``value`` as a valid message id (bytes-like becomes ``bytes``), or InvalidArgumentError naming what is wrong."""
    if isinstance(value, str):
        if value == "":
            raise InvalidArgumentError(f"{name} is empty; give 1 to {MAX_ID_LENGTH} characters or leave it unset")
        _check_length(name, value)
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if not 1 <= len(raw) <= MAX_BINARY_ID_BYTES:
            raise InvalidArgumentError(
                f"{name} is binary of {len(raw)} bytes; a binary id holds 1 to {MAX_BINARY_ID_BYTES} bytes "
                f"(its text form, hex, at most {MAX_ID_LENGTH} characters)"
            )
        return raw
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= ULONG_MAX:
            raise InvalidArgumentError(f"{name} {value} is not a ulong: a numeric id must lie between 0 and 2**64 - 1")
        return int(value)
    raise InvalidArgumentError(
        f"{name} must be a string, binary (bytes), a UUID or a ulong (int), not {type(value).__name__}"
    )


def validate_ids(message_id: object, partition_key: object, session_id: object) -> None:
    """Reject ids Service Bus rejects, naming what was wrong and what is allowed.

    ``message_id`` may be any :data:`MessageId`; ``partition_key`` and ``session_id`` must be text.
    """
    if message_id is not None:
        normalize_message_id(message_id)
    for name, value in (("partition_key", partition_key), ("session_id", session_id)):
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{name} must be text (a string), not {type(value).__name__}")
        _check_length(name, value)
    if session_id is not None and partition_key is not None and session_id != partition_key:
        raise InvalidOperationError(
            f"partition_key {partition_key!r} differs from session_id {session_id!r}: "
            "when both are set they must be equal"
        )


def effective_partition_key(
    message_id: MessageId | None, partition_key: str | None, session_id: str | None
) -> MessageId | None:
    if partition_key is not None:
        return partition_key
    if session_id is not None:
        return session_id
    return message_id


def dedup_key(
    message_id: MessageId,
    partition_key: str | None = None,
    session_id: str | None = None,
    *,
    partitioned: bool = False,
) -> DedupKey:
    """The dedup key of a message (validates the ids first)."""
    validate_ids(message_id, partition_key, session_id)
    message_id = normalize_message_id(message_id)
    if not partitioned:
        return DedupKey(message_id, None)
    return DedupKey(message_id, effective_partition_key(message_id, partition_key, session_id))


def require_identifiable(
    message_id: MessageId | None,
    partition_key: str | None,
    session_id: str | None,
    *,
    partitioned: bool,
    requires_duplicate_detection: bool,
) -> None:
    """Azure rejects a message with neither PartitionKey nor MessageId on a partitioned dedup entity."""
    if (
        partitioned
        and requires_duplicate_detection
        and message_id is None
        and partition_key is None
        and session_id is None
    ):
        raise InvalidArgumentError(
            "a message sent to a partitioned entity with duplicate detection needs a message_id or a "
            "partition_key; set message_id (1 to 128 characters)"
        )


def migrate_key_text_v0(text: str, *, partitioned: bool) -> str:
    """A key text stored before typed ids (store schema 0) in today's form: only NUL-led string ids change."""
    if _TAG not in text:
        return text
    if not partitioned:
        return id_text(text)
    length, sep, rest = text.partition(":")
    if not sep or not length.isdigit() or int(length) > len(rest):
        return text  # not a key this release could have written; left as it is
    pk, message_id = rest[: int(length)], rest[int(length) :]
    return key_text(message_id, pk)
