"""The dedup key: what two sends must share to be duplicates.

Not partitioned: ``message_id`` alone. Partitioned: ``(partition_key,
message_id)`` where the partition key is the message's ``partition_key``,
else its ``session_id``, else its ``message_id``. Nothing else counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from oncebus.core.errors import InvalidArgumentError

MAX_ID_LENGTH = 128
_MASK64 = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class DedupKey:
    """A dedup key; ``text`` is its canonical, unambiguous encoding (stored durably)."""

    message_id: str
    partition_key: str | None

    @property
    def text(self) -> str:
        return key_text(self.message_id, self.partition_key)

    @property
    def digest(self) -> tuple[int, int]:
        return key_digest(self.text)


def key_text(message_id: str, partition_key: str | None) -> str:
    """The canonical text of a key; ``partition_key`` is None on entities that are not partitioned."""
    if partition_key is None:
        return message_id
    # length prefix keeps (pk, id) pairs apart whatever characters they hold
    return f"{len(partition_key)}:{partition_key}{message_id}"


def key_digest(text: str) -> tuple[int, int]:
    """A 128-bit digest of a key's text for the in-memory index: two keyed 64-bit SipHash values.

    Python's string hash is SipHash with a random per-process key, computed once per string;
    the second half hashes the text with a separator appended, so the halves are independent.
    Digests are never stored (the store keeps the key text and the index is rebuilt from it),
    so their changing from one process to the next does not matter. A false duplicate needs
    two keys colliding on all 128 bits: about 1 in 10^24 for ten million keys held.
    """
    return hash(text) & _MASK64, hash(text + "\x1f") & _MASK64


def validate_ids(message_id: str | None, partition_key: str | None, session_id: str | None) -> None:
    """Reject ids Service Bus rejects, naming what was wrong and what is allowed."""
    for name, value in (("message_id", message_id), ("partition_key", partition_key), ("session_id", session_id)):
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{name} must be text, not {type(value).__name__}")
        if len(value) > MAX_ID_LENGTH:
            raise InvalidArgumentError(f"{name} is {len(value)} characters long; at most {MAX_ID_LENGTH} are allowed")
        if name == "message_id" and value == "":
            raise InvalidArgumentError("message_id is empty; give 1 to 128 characters or leave it unset")
    if session_id is not None and partition_key is not None and session_id != partition_key:
        raise InvalidArgumentError(
            f"partition_key {partition_key!r} differs from session_id {session_id!r}: "
            "when both are set they must be equal"
        )


def effective_partition_key(message_id: str | None, partition_key: str | None, session_id: str | None) -> str | None:
    if partition_key is not None:
        return partition_key
    if session_id is not None:
        return session_id
    return message_id


def dedup_key(
    message_id: str,
    partition_key: str | None = None,
    session_id: str | None = None,
    *,
    partitioned: bool = False,
) -> DedupKey:
    """The dedup key of a message (validates the ids first)."""
    validate_ids(message_id, partition_key, session_id)
    if not partitioned:
        return DedupKey(message_id, None)
    return DedupKey(message_id, effective_partition_key(message_id, partition_key, session_id))


def require_identifiable(
    message_id: str | None,
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
