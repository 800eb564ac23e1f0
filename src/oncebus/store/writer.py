"""The group-commit writer both durable stores (SQLite, PostgreSQL) share.

Units submitted by the broker queue up for one writer thread, which takes everything queued so far (up to
``MAX_UNITS_PER_COMMIT``) and commits it in one transaction; a unit is never split. A group holding any durable
unit commits durably as a whole; a group of settlements alone (``durable=False``, see ``store.base``) commits
relaxed (process-crash safe, not yet power-safe), and the writer makes it durable itself within
``SETTLEMENT_SYNC_SECONDS`` when no durable commit comes first. A group that fails is retried unit by unit, so
one bad unit fails alone; every failed unit gets a :class:`StoreWriteError` naming the cause.

Dedup checkpoints (``checkpoint_dedup``) go through the same queue: a forked child writes the images, then the
checkpoint is queued behind every unit submitted before the fork and stored only if none of them failed and
the store was not reloaded meanwhile. A clean ``close`` stores images of the indexes given to
``keep_dedup_images`` once every unit is committed.

What differs between the stores is their database, given by the hooks a store implements (the methods that
raise ``NotImplementedError`` here, and the few that do nothing by default):

- ``_apply(ops, durable)``: one transaction, all or nothing (raises if it failed);
- ``_make_durable()``: make every relaxed commit durable (SQLite: fsync the WAL; PostgreSQL: a synchronous
  commit, whose WAL flush carries the earlier ones);
- ``_write_error(exc)``: the error a unit whose write failed gets;
- ``_before_group()``, ``_retry_each(exc)``, ``_idle()``: checks before a group (SQLite: its files still there),
  whether a failed group is worth retrying unit by unit (not over a lost connection), the idle tick;
- ``_take_deleted()``: the entities the last ``_apply`` calls deleted (a checkpoint leaves them out);
- ``_new_image_path()``, ``_store_checkpoint(checkpoint, marks)``, ``_checkpoint_stored(checkpoint)``,
  ``_write_images(indexes, since_us)``: where a checkpoint's child writes, how a checkpoint is committed,
  and how the images of a clean stop are stored;
- ``_close_connections()``.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from oncebus.core.errors import StoreWriteError
from oncebus.store import dedup_images, settlement_log
from oncebus.store.base import (
    SETTLEMENT_SYNC_SECONDS,
    DedupIndexes,
    Op,
)

_LOG = logging.getLogger("oncebus.store")
MAX_UNITS_PER_COMMIT = 512
_STOP = object()
_WAKE = object()  # the writer recomputes when to sync (a settlement was committed on another thread)

Unit = tuple[list[Op], Future[None] | None]  # a unit and its waiter (None: its waiter was cancelled)


@dataclass(slots=True)
class Checkpoint:
    """A dedup checkpoint being written by a forked child (see ``GroupCommitWriter.checkpoint_dedup``)."""

    path: Path
    token: bytes
    marks: dict[str, int]  # entity -> since_us
    submitted: int  # units submitted before the fork: the image holds their keys, and no later unit's
    loads: int  # the store's loads before the fork: a reload since means memory was rebuilt
    pid: int
    started: float  # monotonic
    pause_seconds: float  # how long the fork held the caller (the broker's loop)
    waiter: threading.Thread | None = None
    cancelled: bool = False


class GroupCommitWriter:
    """The writer thread, its queue, its counters and the dedup checkpoints' life; a store subclasses it and
    implements the hooks (see the module)."""

    idle_seconds: float | None = None  # wake this often with nothing queued, for ``_idle`` (None: never)
    where = ""  # the store, in log messages

    def _init_writer(self) -> None:
        """Set the writer's state (call first in ``__init__``); ``_start_writer`` starts its thread."""
        self._lock = threading.Lock()  # the writer connection: the writer's transactions, load(), close()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._submit_lock = threading.Lock()
        self._submitted = 0  # units queued so far (under _submit_lock)
        self._finished = 0  # units of those the writer has committed or failed (under _lock)
        self._unsynced_since: float | None = None  # monotonic time of the first commit not durable yet
        self._keep_images: Callable[[], DedupIndexes] | None = None
        self._keep_since_us = 0
        self._loads = 0  # load() calls so far: a checkpoint forked before a reload holds memory from before it
        self._failures_at_load = 0  # a write failed since the broker last loaded: its memory may hold more
        self._checkpointing: Checkpoint | None = None  # the checkpoint being written, until stored or dropped
        self._deleted_at: dict[str, int] = {}  # entity -> the number of the last unit that deleted it (writer)
        self._closing = False
        self.commits = 0
        self.units = 0
        self.failures = 0
        self.relaxed_commits = 0  # transactions committed without being durable yet (settlements only)
        self.syncs = 0  # what the writer did to make them durable (when no durable commit came first)
        self.checkpoints = 0  # dedup checkpoints stored while serving
        self.checkpoints_dropped = 0  # written but not stored (a write failed, a reload, the child failed)
        self.checkpoint_pauses: deque[float] = deque(maxlen=100)  # seconds the last forks held the caller
        # called on the writer thread after each commit with (seconds, units): metrics, see broker/counters.py
        self.commit_observer: Callable[[float, int], None] | None = None
        self._writer: threading.Thread | None = None

    def _start_writer(self, name: str) -> None:
        self._writer = threading.Thread(target=self._write_loop, name=name, daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ the hooks
    def _apply(self, ops: list[Op], durable: bool) -> None:
        """Apply ``ops`` in one transaction, all or nothing; durable before it returns if ``durable``."""
        raise NotImplementedError

    def _make_durable(self) -> None:
        """Make every transaction committed so far durable (raises if that failed)."""
        raise NotImplementedError

    def _write_error(self, exc: BaseException) -> StoreWriteError:
        raise NotImplementedError

    def _reason(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def _before_group(self) -> None:
        """Before a group is written (under the lock); raising fails the whole group with that error."""

    def _retry_each(self, exc: BaseException) -> bool:
        """Whether a group that failed with ``exc`` is retried unit by unit."""
        return True

    def _idle(self) -> None:
        """Every ``idle_seconds`` with nothing queued (under the lock)."""

    def _take_deleted(self) -> Iterable[str]:
        """The entities deleted by the transactions tried since the last call (landed or not)."""
        raise NotImplementedError

    def _new_image_path(self) -> Path:
        raise NotImplementedError

    def _store_checkpoint(self, checkpoint: Checkpoint, marks: dict[str, int]) -> None:
        """Commit ``checkpoint``'s images of the entities in ``marks`` durably in place of the previous ones
        (under the lock; raising drops it and the previous one stays)."""
        raise NotImplementedError

    def _checkpoint_stored(self, checkpoint: Checkpoint) -> None:
        """After ``checkpoint`` was stored (under the lock): tidy up what it replaced."""

    def _write_images(self, indexes: DedupIndexes, since_us: int) -> None:
        """Store images of ``indexes`` at a clean stop (under the lock, every unit committed)."""
        raise NotImplementedError

    def _close_connections(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ submitting
    def submit(self, unit: Sequence[Op], *, durable: bool = True) -> Future[None]:
        future: Future[None] = Future()
        if not durable and not settlement_log.settlements_only(unit):
            durable = True  # what stores a message, a key or a definition is durable first, whatever was asked
        with self._submit_lock:
            self._submitted += 1
            self._queue.put((list(unit), future, durable))
        return future

    def _wake_writer(self) -> None:
        self._queue.put(_WAKE)

    def _note_load(self) -> None:
        """A ``load`` (under the lock): memory is rebuilt from what the store holds now."""
        self._failures_at_load = self.failures
        self._loads += 1

    # ------------------------------------------------------------------ the writer thread
    def _write_loop(self) -> None:
        while True:
            timeout = self.idle_seconds
            if self._unsynced_since is not None:  # wake to make them durable in time
                timeout = max(self._unsynced_since + SETTLEMENT_SYNC_SECONDS - time.monotonic(), 0.0)
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                with self._lock:
                    try:
                        self._idle()
                    except Exception as exc:  # reported again, to a caller, on the next commit
                        _LOG.debug("store check failed: %s", exc)
                    self._sync_if_due()
                continue
            if item is _STOP:
                return
            if item is _WAKE:
                continue
            if isinstance(item, Checkpoint):
                with self._lock:
                    self._commit_checkpoint(item)
                continue
            group = [item]
            stop = False
            checkpoint: Checkpoint | None = None  # after this group (it must not overtake it)
            while len(group) < MAX_UNITS_PER_COMMIT:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                if isinstance(more, Checkpoint):
                    checkpoint = more
                    break
                if more is not _WAKE:
                    group.append(more)
            with self._lock:
                try:
                    self._commit_group(group)  # type: ignore[arg-type]
                finally:  # units are numbered in the order submitted; a deletion tried counts, landed or not
                    self._finished += len(group)
                    for path in self._take_deleted():
                        self._deleted_at[path] = self._finished
                if checkpoint is not None:
                    self._commit_checkpoint(checkpoint)
                self._sync_if_due()
            if stop:
                return

    def _commit_group(self, group: list[tuple[list[Op], Future[None], bool]]) -> None:
        # a unit whose waiter was cancelled is still written: the broker's memory already has it
        units: list[Unit] = [
            (unit, future if future.set_running_or_notify_cancel() else None) for unit, future, _ in group
        ]
        durable = [d for _, _, d in group]
        self.units += len(units)
        try:
            self._before_group()
        except Exception as exc:  # nothing written now would last
            self._fail(units, exc)
            return
        started = time.perf_counter()
        try:
            self._transaction([op for unit, _ in units for op in unit], any(durable))
        except Exception as exc:
            if len(units) == 1 or not self._retry_each(exc):
                self._fail(units, exc)
                return
            # nothing of the group is stored; one unit's failure must not fail the others: each on its own
            for (unit, future), unit_durable in zip(units, durable, strict=True):
                try:
                    self._transaction(unit, unit_durable)
                except Exception as unit_exc:
                    self._fail([(unit, future)], unit_exc)
                else:
                    if future is not None:
                        future.set_result(None)
            return
        if self.commit_observer is not None and any(unit for unit, _ in units):
            self.commit_observer(time.perf_counter() - started, len(units))
        for _, future in units:
            if future is not None:
                future.set_result(None)

    def _transaction(self, ops: list[Op], durable: bool = True) -> None:
        """Apply ``ops`` in one transaction, all or nothing; durable before it returns if ``durable``."""
        if not ops:
            return
        self._apply(ops, durable)
        self.commits += 1
        if durable:  # the log is made durable as a prefix: this commit carried every one before it
            self._unsynced_since = None
        else:
            self.relaxed_commits += 1
            if self._unsynced_since is None:
                self._unsynced_since = time.monotonic()

    def _fail(self, units: list[Unit], exc: BaseException) -> None:
        self.failures += 1
        error = exc if isinstance(exc, StoreWriteError) else self._write_error(exc)
        for _, future in units:
            if future is not None:
                future.set_exception(error)

    def _sync_if_due(self) -> None:
        if self._unsynced_since is not None and time.monotonic() >= self._unsynced_since + SETTLEMENT_SYNC_SECONDS:
            try:
                self._sync()
            except Exception as exc:  # tried again; the next durable commit makes them durable anyway
                _LOG.debug("store sync failed: %s", exc)
                if self._unsynced_since is not None:
                    self._unsynced_since = time.monotonic()  # not before SETTLEMENT_SYNC_SECONDS: no busy loop

    def _sync(self) -> None:
        self._make_durable()
        self.syncs += 1
        self._unsynced_since = None

    def commit_now(self, unit: Sequence[Op]) -> bool:
        """Every unit goes through the writer's queue here (``submit``); a store that can commit a settlement
        on the caller's thread overrides this (``SqliteStore``)."""
        return False

    # ------------------------------------------------------------------ dedup checkpoints
    def keep_dedup_images(self, indexes: Callable[[], DedupIndexes], since_us: int) -> None:
        """At ``close``, once every unit is committed, store images of ``indexes()`` (holding every key first
        accepted before ``since_us``) as the checkpoint the next start reads, unless a write failed since the last
        ``load`` (the broker's memory may then hold a key the store does not, even if it has not heard of the
        failure yet: the stored checkpoint, if any, stays); see ``dedup_images``."""
        self._keep_images = indexes
        self._keep_since_us = since_us

    def checkpoint_dedup(self, indexes: DedupIndexes, since_us: int) -> bool:
        """Start a checkpoint of the dedup ``indexes`` as they are now, marked ``since_us``; call it on the thread
        that judges and submits (the broker's loop), between two of its steps, so the indexes hold exactly the keys
        of the units submitted so far, each first accepted at or before ``since_us``.

        A forked child writes the images (the fork is the caller's only pause); once it has, the checkpoint goes
        through the writer's queue, behind every unit submitted before the fork, and is stored in place of
        the previous one only if none of them failed and the store was not reloaded meanwhile (else the images
        are dropped and the previous checkpoint stays). An entity deleted by a unit submitted after the fork is
        left out (its keys are gone from the rows; the same name may be a new queue by then). Returns False
        (nothing started) while one is being written, while closing, or where processes cannot fork.
        """
        if self._checkpointing is not None or self._closing or not hasattr(os, "fork"):
            return False
        entries = list(indexes)
        if not entries:
            return False
        with self._submit_lock:
            submitted = self._submitted
        path = self._new_image_path()
        token = secrets.token_bytes(16)
        started = time.perf_counter()
        try:
            pid = dedup_images.fork_write(path, token, entries)
        except OSError as exc:  # out of memory or processes: the next one tries again
            _LOG.warning("could not start a dedup checkpoint: %s", exc)
            return False
        pause = time.perf_counter() - started
        self.checkpoint_pauses.append(pause)
        marks = {name: since_us for name, _ in entries}
        checkpoint = Checkpoint(path, token, marks, submitted, self._loads, pid, time.monotonic(), pause)
        checkpoint.waiter = threading.Thread(
            target=self._await_checkpoint, args=(checkpoint,), name="oncebus-dedup-checkpoint", daemon=True
        )
        self._checkpointing = checkpoint
        checkpoint.waiter.start()
        return True

    def wait_checkpoint(self, timeout: float | None = None) -> bool:
        """Wait until no checkpoint is being written (stored or dropped); False if one still is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._checkpointing is not None:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def _await_checkpoint(self, checkpoint: Checkpoint) -> None:
        """On a thread of its own: wait for the child, then queue the checkpoint behind the units before it."""
        try:
            _, status = os.waitpid(checkpoint.pid, 0)
        except ChildProcessError:  # reaped by someone else (a child watcher waiting for any child): unknown
            status = -1
        if status == 0 and not checkpoint.cancelled:
            self._queue.put(checkpoint)
            return
        if not checkpoint.cancelled:
            _LOG.warning("the dedup checkpoint's child process failed (status %s); the next one tries again", status)
        self._drop_checkpoint(checkpoint)

    def _drop_checkpoint(self, checkpoint: Checkpoint) -> None:
        dedup_images.discard(checkpoint.path)
        dedup_images.discard(checkpoint.path.with_name(checkpoint.path.name + dedup_images.TMP_SUFFIX))
        self.checkpoints_dropped += 1
        self._checkpointing = None

    def _commit_checkpoint(self, checkpoint: Checkpoint) -> None:
        """On the writer, under the lock, every unit submitted before the fork committed or failed by now."""
        if self.failures != self._failures_at_load or self._loads != checkpoint.loads:
            self._drop_checkpoint(checkpoint)  # memory may have held a key the store does not
            return
        marks = {
            entity: since
            for entity, since in checkpoint.marks.items()
            if self._deleted_at.get(entity, 0) <= checkpoint.submitted
        }
        try:
            self._store_checkpoint(checkpoint, marks)
        except Exception as exc:  # the previous checkpoint stays; the next one tries again
            _LOG.warning("could not store a dedup checkpoint in %s: %s", self.where, self._reason(exc))
            self._drop_checkpoint(checkpoint)
            return
        self._unsynced_since = None  # its durable commit carried every transaction before it
        self.checkpoints += 1
        self._checkpointing = None
        self._checkpoint_stored(checkpoint)

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        self._closing = True
        checkpoint = self._checkpointing
        if checkpoint is not None and checkpoint.waiter is not None:  # a clean stop writes a newer one anyway
            checkpoint.cancelled = True
            try:
                os.kill(checkpoint.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            checkpoint.waiter.join()
        if self._writer is not None and self._writer.is_alive():
            self._queue.put(_STOP)
            self._writer.join()
        with self._lock:
            if self._unsynced_since is not None:
                try:
                    self._sync()
                except Exception as exc:
                    _LOG.warning("could not make the last settlements durable in %s on close: %s", self.where, exc)
            self._save_images()
            self._close_connections()

    def _save_images(self) -> None:
        keep, self._keep_images = self._keep_images, None
        if keep is None or self.failures != self._failures_at_load or not self._writer_clean():
            return
        try:
            self._write_images(keep(), self._keep_since_us)
        except Exception as exc:  # the stored checkpoint stays (or the rows, without one)
            _LOG.warning("could not write the dedup index images of %s: %s", self.where, self._reason(exc))

    def _writer_clean(self) -> bool:
        """Whether every unit submitted was committed (the writer stopped with an empty queue)."""
        return self._queue.empty() and (self._writer is None or not self._writer.is_alive())
