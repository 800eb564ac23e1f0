"""The duplicate-detection rule and its index.

A send at time ``t`` whose key was first accepted at ``t0`` is a duplicate
when ``t < t0 + W`` (``W`` the entity's current history window). Duplicates
never refresh ``t0``. The contract: ``docs/semantics.md``.

The index keeps, per held key, a 128-bit digest (keyed BLAKE2b, see ``keyed_digest``) and ``t0`` (microseconds) in
an append-only, time-ordered log of fixed-size blocks, and an open-addressing
hash table of 32-bit references into that log (the shape of nats-server's
``ddmap`` + ``ddarr``). A check is O(1) whatever the window; expiry pops the
log's head in time order; memory is about 32-40 bytes per held key.

Keys that leave the window move to a bounded "recently expired" table of the
same shape, so a resend that arrives just after the window is counted as a
*late resend* with its delay (Azure drops that information silently).
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable, Sequence
from datetime import timedelta
from io import BufferedIOBase
from typing import BinaryIO, NamedTuple, Protocol, cast

from oncebus.core.durations import to_micros
from oncebus.core.keys import (
    DIGEST_SECRET,
    MessageId,
    dedup_key,
    effective_partition_key,
    id_text,
    key_digest,
    key_text,
    keyed_digest,
)

_BLOCK_BITS = 12
_BLOCK = 1 << _BLOCK_BITS  # entries per log block
_BLOCK_MASK = _BLOCK - 1
_REF_MOD = 0xFFFFFFFF  # a slot holds seq % _REF_MOD + 1 (0 means empty)
_DEAD = 0xFFFFFFFFFFFFFFFF  # time marker of a removed log entry
_MIN_SLOTS = 1024
_LOG_HEADER = struct.Struct("<6Q")  # head, tail, block base, live, blocks, slots
_INDEX_HEADER = struct.Struct("<Q16s")  # the index's clock (now_us), its digests' secret
_EMPTY_BLOCK = bytes(24 * _BLOCK)


class ImageError(ValueError):
    """A dedup index image that cannot be trusted (short, inconsistent or failing its checksum)."""


class _Image:
    """Reads an image from a binary file into buffers, with a running CRC-32 of what was read."""

    def __init__(self, file: BinaryIO, length: int) -> None:
        self.file = file
        self.left = length
        self.crc = 0

    def into(self, buffer: array[int]) -> None:
        view = memoryview(buffer).cast("B")
        if view.nbytes > self.left or cast(BufferedIOBase, self.file).readinto(view) != view.nbytes:
            raise ImageError("the image is shorter than its contents")
        self.left -= view.nbytes
        self.crc = zlib.crc32(view, self.crc)

    def struct(self, shape: struct.Struct) -> tuple[int, ...]:
        buffer = array("B", bytes(shape.size))
        self.into(buffer)
        return shape.unpack(buffer.tobytes())


class _DigestLog:
    """Time-ordered log of (digest, t0) with an O(1) digest lookup table."""

    __slots__ = ("_block_base", "_blocks", "_first_block", "_head", "_live", "_mask", "_slots", "_tail")

    def __init__(self) -> None:
        self._blocks: list[array[int] | None] = []
        self._first_block = 0  # index in _blocks of the head's block
        self._block_base = 0  # seq of the first entry of _blocks[0]
        self._head = 0  # seq of the oldest entry (maybe removed)
        self._tail = 0  # seq the next entry gets
        self._live = 0
        self._slots = array("I", bytes(4 * _MIN_SLOTS))
        self._mask = _MIN_SLOTS - 1

    def __len__(self) -> int:
        return self._live

    def _entry(self, seq: int) -> tuple[array[int], int]:
        off = seq - self._block_base
        block = self._blocks[off >> _BLOCK_BITS]
        assert block is not None
        return block, (off & _BLOCK_MASK) * 3

    def _seq_of(self, ref: int) -> int:
        head = self._head
        return head + ((ref - 1 - head) % _REF_MOD)

    def find(self, hi: int, lo: int) -> tuple[int, int]:
        """(slot, t0) of the digest, or (-1, 0) when absent."""
        slots, mask, blocks = self._slots, self._mask, self._blocks
        head, base = self._head, self._block_base
        head_mod = head % _REF_MOD
        i = hi & mask
        while True:
            ref = slots[i]
            if not ref:
                return -1, 0
            off = head + ((ref - 1 - head_mod) % _REF_MOD) - base  # the hot path: _seq_of and _entry inlined
            block = blocks[off >> _BLOCK_BITS]
            k = (off & _BLOCK_MASK) * 3
            if block[k] == hi and block[k + 1] == lo:  # type: ignore[index]
                return i, block[k + 2]  # type: ignore[index]
            i = (i + 1) & mask

    def append(self, hi: int, lo: int, t0: int) -> None:
        """Add a digest known to be absent, at a time not before the newest entry's."""
        seq = self._tail
        off = seq - self._block_base
        index = off >> _BLOCK_BITS
        if index == len(self._blocks):
            self._blocks.append(array("Q", bytes(24 * _BLOCK)))
        block = self._blocks[index]
        assert block is not None
        k = (off & _BLOCK_MASK) * 3
        block[k] = hi
        block[k + 1] = lo
        block[k + 2] = t0
        self._tail = seq + 1
        self._live += 1
        if self._live * 2 > len(self._slots):
            self._rebuild(len(self._slots) * 2)
        else:
            self._place(hi, seq % _REF_MOD + 1)

    def _place(self, hi: int, ref: int) -> None:
        slots, mask = self._slots, self._mask
        i = hi & mask
        while slots[i]:
            i = (i + 1) & mask
        slots[i] = ref

    def oldest(self) -> tuple[int, int, int] | None:
        """(hi, lo, t0) of the oldest live entry."""
        self._skip_removed()
        if self._head == self._tail:
            return None
        block, k = self._entry(self._head)
        return block[k], block[k + 1], block[k + 2]

    def pop_oldest(self) -> tuple[int, int, int]:
        self._skip_removed()
        block, k = self._entry(self._head)
        hi, lo, t0 = block[k], block[k + 1], block[k + 2]
        slot, _ = self.find(hi, lo)
        self._clear_slot(slot)
        self._live -= 1
        self._advance_head()
        return hi, lo, t0

    def remove(self, slot: int) -> None:
        """Remove the entry the table slot refers to."""
        seq = self._seq_of(self._slots[slot])
        block, k = self._entry(seq)
        block[k + 2] = _DEAD
        self._clear_slot(slot)
        self._live -= 1
        if seq == self._head:
            self._advance_head()

    def _skip_removed(self) -> None:
        while self._head < self._tail:
            block, k = self._entry(self._head)
            if block[k + 2] != _DEAD:
                return
            self._advance_head()

    def _advance_head(self) -> None:
        self._head += 1
        if (self._head - self._block_base) >> _BLOCK_BITS > self._first_block:
            self._blocks[self._first_block] = None
            self._first_block += 1
            if self._first_block >= 64 and self._first_block * 2 >= len(self._blocks):
                del self._blocks[: self._first_block]
                self._block_base += self._first_block * _BLOCK
                self._first_block = 0
        if self._live * 8 < len(self._slots) and len(self._slots) > _MIN_SLOTS:
            self._rebuild(len(self._slots) // 2)

    def _clear_slot(self, i: int) -> None:
        """Backward-shift deletion: keeps probe chains intact without tombstones."""
        slots, mask = self._slots, self._mask
        j = i
        while True:
            j = (j + 1) & mask
            ref = slots[j]
            if not ref:
                break
            block, k = self._entry(self._seq_of(ref))
            home = block[k] & mask
            if i <= j:
                if i < home <= j:
                    continue
            elif home > i or home <= j:
                continue
            slots[i] = ref
            i = j
        slots[i] = 0

    def _rebuild(self, size: int) -> None:
        size = max(size, _MIN_SLOTS)
        self._slots = array("I", bytes(4 * size))
        self._mask = size - 1
        for seq in range(self._head, self._tail):
            block, k = self._entry(seq)
            if block[k + 2] != _DEAD:
                self._place(block[k], seq % _REF_MOD + 1)

    def nbytes(self) -> int:
        blocks = sum(1 for b in self._blocks if b is not None)
        return blocks * 24 * _BLOCK + len(self._slots) * 4 + 8 * len(self._blocks)

    def dump(self, write: Callable[[memoryview], object]) -> None:
        """Write the log's blocks and table as they are in memory (``load`` reads them back in bulk)."""
        blocks = [b for b in self._blocks[self._first_block :] if b is not None]
        base = self._block_base + self._first_block * _BLOCK
        header = _LOG_HEADER.pack(self._head, self._tail, base, self._live, len(blocks), len(self._slots))
        write(memoryview(header))
        for block in blocks:
            write(memoryview(block).cast("B"))
        write(memoryview(self._slots).cast("B"))

    @classmethod
    def load(cls, image: _Image) -> _DigestLog:
        head, tail, base, live, blocks, slots = image.struct(_LOG_HEADER)
        if not (
            base <= head <= tail <= base + blocks * _BLOCK
            and head - base < _BLOCK
            and live <= tail - head
            and slots >= _MIN_SLOTS
            and slots & (slots - 1) == 0
            and live * 2 <= slots
        ):
            raise ImageError("the image's log header is inconsistent")
        log = cls()
        log._block_base, log._head, log._tail, log._live = base, head, tail, live
        for _ in range(blocks):
            block = array("Q", _EMPTY_BLOCK)
            image.into(block)
            log._blocks.append(block)
        log._slots = array("I", [0]) * slots
        log._mask = slots - 1
        image.into(log._slots)
        return log


def is_duplicate(t_us: int, first_accepted_us: int | None, window_us: int) -> bool:
    """The rule for one send: a duplicate when its key was first accepted at ``t0`` and ``t < t0 + W``."""
    return first_accepted_us is not None and t_us < first_accepted_us + window_us


def judge_key_sends(
    first_accepted_us: int | None, times_us: list[int], window_us: int
) -> tuple[list[bool], int | None]:
    """The rule over one key's sends in time order: which are kept, and the key's ``t0`` after them.

    A kept send sets ``t0``; a duplicate never moves it. For callers that group sends by key
    (the Spark pipeline) rather than judging a time-ordered stream with a ``DedupIndex``.
    """
    kept = []
    t0 = first_accepted_us
    for t_us in times_us:
        duplicate = is_duplicate(t_us, t0, window_us)
        kept.append(not duplicate)
        if not duplicate:
            t0 = t_us
    return kept, t0


class Verdict(NamedTuple):
    """The rule's answer for one send."""

    duplicate: bool
    first_accepted_us: int | None = None  # t0 of the held key, for a duplicate
    late_resend_delay_us: int | None = None  # for a new send whose key left the window recently


class DedupIndex:
    """Exact duplicate detection for one entity.

    Times are integer microseconds, non-decreasing across calls (the caller's
    clock must not run backwards; the broker guards its clock). The window may
    change at any time and applies to keys already held.
    """

    def __init__(self, window: timedelta, *, recently_expired_capacity: int = 1_000_000) -> None:
        self._window_us = to_micros(window)
        self._held = _DigestLog()
        self._expired = _DigestLog()
        self._expired_capacity = recently_expired_capacity
        self._now_us = 0
        self._next_expiry_us = 0  # nothing can expire before this time (0: check)
        self._secret = DIGEST_SECRET
        self._digest = key_digest

    @property
    def window(self) -> timedelta:
        return timedelta(microseconds=self._window_us)

    @property
    def window_us(self) -> int:
        return self._window_us

    def set_window(self, value: timedelta, now_us: int) -> None:
        """Change the window at ``now_us``: keys that left the old window stay gone; held keys get the new one."""
        self._tick(now_us)
        self._window_us = to_micros(value)
        self._next_expiry_us = 0

    def __len__(self) -> int:
        return len(self._held)

    @property
    def recently_expired(self) -> int:
        return len(self._expired)

    def oldest_first_accepted_us(self) -> int | None:
        oldest = self._held.oldest()
        return None if oldest is None else oldest[2]

    def nbytes(self) -> int:
        """Bytes of the held keys' structures (the recently-expired table not included)."""
        return self._held.nbytes()

    def _tick(self, now_us: int) -> None:
        if now_us < self._now_us:
            raise ValueError(f"time went backwards: {now_us} us after {self._now_us} us")
        self._now_us = now_us
        if now_us >= self._next_expiry_us:
            self.expire(now_us)

    def expire(self, now_us: int) -> int:
        """Move keys with ``t0 + W <= now`` out of the window; returns how many moved."""
        moved = 0
        held, expired = self._held, self._expired
        limit = now_us - self._window_us
        while True:
            oldest = held.oldest()
            if oldest is None or oldest[2] > limit:
                break
            hi, lo, t0 = held.pop_oldest()
            moved += 1
            if self._expired_capacity:
                slot, _ = expired.find(hi, lo)
                if slot >= 0:
                    expired.remove(slot)
                if len(expired) >= self._expired_capacity:
                    expired.pop_oldest()
                expired.append(hi, lo, t0)
        # forget recently expired keys one more window after they left
        while True:
            oldest_expired = expired.oldest()
            if oldest_expired is None or oldest_expired[2] > limit - self._window_us:
                break
            expired.pop_oldest()
        # with nothing held, the next key appended (at now or later) can expire no sooner than now + W
        next_expiry = oldest[2] + self._window_us if oldest is not None else now_us + self._window_us
        if oldest_expired is not None:
            next_expiry = min(next_expiry, oldest_expired[2] + 2 * self._window_us)
        self._next_expiry_us = next_expiry
        return moved

    def judge(self, key: str, now_us: int) -> Verdict:
        """Apply the rule to one send: a new key is recorded with ``t0 = now`` (the rule is ``judge_many``'s)."""
        verdict = self.judge_many((key,), now_us)[0]
        assert verdict is not None
        return verdict

    def judge_many(self, keys: Sequence[str | None], now_us: int) -> list[Verdict | None]:
        """``judge`` each key of one send in order at ``now_us`` (None: a message with no key, no verdict): the
        same answers as one ``judge`` a key, with one clock tick and the lookups bound once for the batch."""
        self._tick(now_us)
        digest, held, expired = self._digest, self._held, self._expired
        find, append = held.find, held.append
        verdicts: list[Verdict | None] = []
        for key in keys:
            if key is None:
                verdicts.append(None)
                continue
            hi, lo = digest(key)
            slot, t0 = find(hi, lo)
            if slot >= 0:
                verdicts.append(Verdict(True, t0))
                continue
            if expired._live:
                slot, t0 = expired.find(hi, lo)
                if slot >= 0:
                    expired.remove(slot)
                    append(hi, lo, now_us)
                    verdicts.append(Verdict(False, None, now_us - t0))
                    continue
            append(hi, lo, now_us)
            verdicts.append(_NEW)
        return verdicts

    def dump(self, file: BinaryIO) -> None:
        """An image of the index (held and recently expired keys) for ``load_image``; the window is not in it."""
        file.write(_INDEX_HEADER.pack(self._now_us, self._secret))
        self._held.dump(file.write)
        self._expired.dump(file.write)

    def load_image(self, file: BinaryIO, length: int, crc: int) -> None:
        """Replace what the index holds with an image ``dump`` wrote (``length`` bytes from ``file``'s position,
        CRC-32 ``crc``), read in bulk; ``ImageError`` (the index unchanged) when it does not check out."""
        image = _Image(file, length)
        now_us, secret = cast(tuple[int, bytes], image.struct(_INDEX_HEADER))
        held = _DigestLog.load(image)
        expired = _DigestLog.load(image)
        if image.left or image.crc != crc:
            raise ImageError("the image fails its checksum")
        self._held, self._expired = held, expired
        if secret != self._secret:
            self._secret, self._digest = secret, keyed_digest(secret)
        self._now_us = max(self._now_us, now_us)
        self._next_expiry_us = 0

    def restore(self, key: str, first_accepted_us: int) -> None:
        """Rebuild from durable history; call in ``first_accepted_us`` order. A key accepted again after it
        left the window has a row per acceptance until pruning: the later one replaces the earlier."""
        hi, lo = self._digest(key)
        slot, t0 = self._held.find(hi, lo)
        if slot >= 0:
            if t0 >= first_accepted_us:
                return
            self._held.remove(slot)
        self._now_us = max(self._now_us, first_accepted_us)
        self._held.append(hi, lo, first_accepted_us)
        self._next_expiry_us = 0


class KeysLoading(Protocol):
    """Keys being loaded into detectors on a thread of their own (``broker/recovery.KeyLoader``)."""

    def wait_for_keys(self) -> None:
        """Return once the keys are loaded (at once on the loading thread itself); raise if they cannot be."""
        ...


class DuplicateDetector:
    """The rule for one entity: its settings, its keys and its index.

    ``judge`` records a new key at once, so the second copy of a key within
    one batch is a duplicate of the first. Callers validate a whole batch
    (``key_of`` for each message) before judging any of it.
    """

    def __init__(
        self,
        *,
        requires_duplicate_detection: bool,
        window: timedelta,
        partitioned: bool,
        recently_expired_capacity: int = 1_000_000,
    ) -> None:
        self.enabled = requires_duplicate_detection
        self.partitioned = partitioned
        self._index = DedupIndex(window, recently_expired_capacity=recently_expired_capacity)
        self._loading: KeysLoading | None = None

    @property
    def index(self) -> DedupIndex:
        """The index; while its keys load on another thread (``load_later``), every other thread's use waits
        for them, so nothing is judged against part of the keys."""
        loading = self._loading
        if loading is not None:
            loading.wait_for_keys()
        return self._index

    def load_later(self, loading: KeysLoading | None) -> None:
        """Its keys are being loaded by ``loading`` (None: they are loaded)."""
        self._loading = loading

    @property
    def window(self) -> timedelta:
        return self._index.window  # not the keys: no wait for them (an image does not hold the window)

    def set_window(self, value: timedelta, now_us: int) -> None:
        if to_micros(value) == self._index.window_us:  # unchanged (an entity updated, serve's topology applied):
            return  # nothing to apply to the keys, so no wait for them while they load
        self.index.set_window(value, now_us)

    def key_of(self, message_id: MessageId, partition_key: str | None = None, session_id: str | None = None) -> str:
        return dedup_key(message_id, partition_key, session_id, partitioned=self.partitioned).text

    def key_of_valid(self, message_id: MessageId, partition_key: str | None, session_id: str | None) -> str:
        """``key_of`` for ids already checked and normalized (``normalize_message_id``; the broker's hot path)."""
        if not self.partitioned:
            return id_text(message_id)
        pk = effective_partition_key(message_id, partition_key, session_id)
        assert pk is not None
        return key_text(message_id, pk)

    def judge(self, key: str, now_us: int) -> Verdict:
        if not self.enabled:
            return _NEW
        return self.index.judge(key, now_us)

    def judge_many(self, keys: Sequence[str | None], now_us: int) -> list[Verdict | None]:
        """``judge`` for each key of one send, in order (None: no key, no verdict); off: every key is new."""
        if not self.enabled:
            return [None if key is None else _NEW for key in keys]
        return self.index.judge_many(keys, now_us)

    def restore(self, key: str, first_accepted_us: int, now_us: int) -> bool:
        """Hold a key from durable history if it is still inside the window at ``now_us`` (call in
        ``first_accepted_us`` order); False when it is not held (expired, or detection is off)."""
        if not self.enabled or first_accepted_us + self.index.window_us <= now_us:
            return False
        self.index.restore(key, first_accepted_us)
        return True

    def dump(self, file: BinaryIO) -> None:
        """An image of the held keys (see ``DedupIndex.dump``)."""
        self.index.dump(file)

    def load_image(self, file: BinaryIO, length: int, crc: int) -> None:
        """Hold the keys of an image ``dump`` wrote (see ``DedupIndex.load_image``); keys that left the
        window since go at the next check."""
        self.index.load_image(file, length, crc)

    def expire(self, now_us: int) -> int:
        """Let the keys whose window has passed go; returns how many went."""
        return self.index.expire(now_us) if self.enabled else 0

    def stats(self, now_us: int) -> DedupStats:
        """Held keys, their memory, and the oldest one's age, after expiring what is due at ``now_us``."""
        if not self.enabled:
            return DedupStats(0, 0, None)
        self.index.expire(now_us)
        oldest = self.index.oldest_first_accepted_us()
        return DedupStats(len(self.index), self.index.nbytes(), None if oldest is None else (now_us - oldest) / 1e6)


class DedupStats(NamedTuple):
    keys_held: int
    index_bytes: int
    oldest_key_age_seconds: float | None


_NEW = Verdict(False)
