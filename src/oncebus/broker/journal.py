"""The commit journal: units of store operations submitted, waited for, and what happens when one fails.

``write`` submits one unit and returns once it is durable; ``write_later`` submits
background work nobody waits for; ``barrier`` waits until everything submitted so
far is durable. If the store fails a write (disk full, I/O error), the caller gets a
``StoreWriteError`` (server-busy) naming the cause, the failure is logged once, and
``check_alive`` refuses work, saying why, until every write in flight has finished;
the journal then calls ``reload`` (the namespace rebuilds itself from what the store
holds, as a restart would) and accepts work again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from oncebus.core.errors import StoreWriteError
from oncebus.store.base import Op, Store

RECOVER_FIRST_SECONDS = 0.05  # after a failed write, the first reload waits this long, doubling up to the next
RECOVER_MAX_SECONDS = 5.0
_LOG = logging.getLogger("oncebus.broker")
Settling = list[tuple[Sequence[Op], Callable[[BaseException | None], None]]]  # settlements and their waiters


class Journal:
    def __init__(self, store: Store, *, reload: Callable[[], None], reloaded: Callable[[], None]) -> None:
        self.store = store
        self._reload = reload
        self._reloaded = reloaded
        self.failure: StoreWriteError | None = None  # set from a failed write until the reload after it
        self.failed_writes = 0  # failed writes so far: a duplicate's verdict holds only if none failed meanwhile
        self._failure_logged = False  # one log line per episode (until a write succeeds again)
        self._recover_delay = RECOVER_FIRST_SECONDS
        self._recovery: asyncio.Task[None] | None = None
        self._in_flight = 0  # writes submitted whose outcome the loop has not handled yet
        self._idle: asyncio.Event | None = None
        self.reloads = 0
        self._settling: Settling = []
        self._batch: list[tuple[Sequence[Op], Callable[[], None] | None]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it last ran on (see ``_running_loop``)
        self._loop_thread = 0  # and that loop's thread

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, as ``asyncio.get_running_loop`` (which raises without one), remembered: the one it
        last ran on while that one runs, on this thread. (``asyncio.get_running_loop`` makes a ``getpid`` system call
        on Python 3.11, and each completion asked for it.)"""
        loop = self._loop
        if loop is None or self._loop_thread != threading.get_ident() or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        return loop

    def start_batch(self) -> None:
        """From now on ``write`` only gathers its units (memory has moved already) until ``end_batch`` writes them
        all as one unit, one store transaction: all of it is stored or none. Only for work nothing else writes
        beside (``oncebus serve`` applies its ``--config`` before any door opens; a transaction's commit gathers
        its unit without yielding the loop, see ``broker.transactions``)."""
        if self._batch is not None:
            raise RuntimeError("a batch is already open")
        self._batch = []

    async def end_batch(self) -> None:
        """Write what the batch gathered as one unit and wait until it is durable."""
        gathered, self._batch = self._batch or [], None
        ops = [op for unit, _ in gathered for op in unit]
        callbacks = [on_commit for _, on_commit in gathered if on_commit is not None]

        def committed() -> None:
            for on_commit in callbacks:
                on_commit()

        if ops or callbacks:
            await self.write(ops, committed)

    def abort_batch(self, why: str) -> None:
        """Drop what the batch gathered (none of it is stored): memory moved ahead of the store for it, so
        the namespace reloads what the store holds, as after a failed write, and refuses work until then."""
        self._batch = None
        self.unwritten(why)

    def unwritten(self, why: str) -> None:
        """Memory moved ahead of the store for work that failed before its unit was submitted (a send's keys
        judged, its records not built): reload what the store holds, as after a failed write, and refuse work
        until then."""
        self._store_failed(StoreWriteError(f"{why}; nothing of it was stored"))

    def check_alive(self) -> None:
        if self.failure is not None:
            raise StoreWriteError(
                f"{self.failure} (oncebus is reloading what the store holds and refuses work until then; "
                "try again shortly)"
            )

    def cancel(self) -> None:
        """Stop a pending recovery (the namespace is closing)."""
        if self._recovery is not None:
            self._recovery.cancel()

    async def write(
        self,
        ops: Sequence[Op],
        on_commit: Callable[[], None] | None = None,
        *,
        verdicts_since: int | None = None,
        durable: bool = True,
    ) -> None:
        """Submit one unit and wait until it is durable (``durable=False``, settlements only: committed,
        process-crash safe and power-safe within ``store.base.SETTLEMENT_SYNC_SECONDS``).

        ``on_commit`` runs on the loop once the unit is durable, even if the caller was cancelled
        meanwhile, so memory never ends up behind the disk. A failed write is reported to the caller
        (and starts the recovery, see the module). ``verdicts_since``: the count of failed writes when
        this unit's duplicates were judged; if a write failed since, a key they were judged against
        may be gone, so the call is refused (what this unit stored stays: a resend is judged afresh).
        """
        self.check_alive()
        if self._batch is not None:  # gathered into one unit, written when the batch ends (see ``batch``)
            self._batch.append((ops, on_commit))
            return
        loop = self._running_loop()
        done: asyncio.Future[None] = loop.create_future()
        done.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if nobody waits

        def committed(future: Future[None]) -> None:
            self._landed()
            error = future.exception()
            if error is not None:
                refusal = self._store_failed(error)
                if not done.done():
                    done.set_exception(refusal)
                return
            self._store_succeeded()
            if on_commit is not None:
                on_commit()
            if done.done():
                return
            if verdicts_since is not None and self.failed_writes != verdicts_since:
                done.set_exception(
                    StoreWriteError(
                        "a send this one was judged a duplicate of failed to store meanwhile; send again "
                        f"(the store's error: {self.failure or 'see the server log'})"
                    )
                )
                return
            done.set_result(None)

        future = self._submit(ops, durable)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(committed, f))
        await asyncio.shield(done)

    def write_later(self, ops: Sequence[Op], on_commit: Callable[[], None] | None = None) -> None:
        """Background writes (expiry, lock-expiry dead-lettering): nobody waits; a failure starts the recovery."""
        if not ops or self.failure is not None:
            return  # while failed, memory is reloaded from the store anyway
        if self._batch is not None:  # part of the batch's unit (a transaction's dead letter forwarded on)
            self._batch.append((ops, on_commit))
            return
        loop = self._running_loop()

        def done(f: Future[None]) -> None:
            self._landed()
            if f.exception() is not None:
                self._store_failed(f.exception())  # type: ignore[arg-type]
            else:
                self._store_succeeded()
                if on_commit is not None:
                    on_commit()

        future = self._submit(ops)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(done, f))

    def settle(self, ops: Sequence[Op], done: Callable[[BaseException | None], None]) -> None:
        """A settlement without a coroutine: the settlements of one loop iteration go to the store as one
        unit (``durable=False``: committed, process-crash safe, power-safe within
        ``store.base.SETTLEMENT_SYNC_SECONDS``); ``done(error)`` runs on the loop once it is committed
        (``None``) or failed (the ``StoreWriteError``, and the recovery starts as for ``write``)."""
        self.check_alive()
        if not self._settling:
            self._running_loop().call_soon(self._flush_settlements)
        self._settling.append((ops, done))

    async def settle_and_wait(self, ops: Sequence[Op], on_commit: Callable[[], None] | None = None) -> None:
        """``settle`` awaited (an abandon, a deferral, a dead-letter move, a completion through the API): the
        settlements of one loop iteration, of whatever kind, go to the store as one unit and each returns once
        that unit is committed. ``on_commit`` runs on the loop once it is, even if the caller was cancelled
        meanwhile. Inside a batch (``start_batch``) it is gathered into the batch's unit, as ``write`` is."""
        if self._batch is not None:
            await self.write(ops, on_commit, durable=False)
            return
        done: asyncio.Future[None] = self._running_loop().create_future()
        done.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if nobody waits

        def settled(error: BaseException | None) -> None:
            if error is None and on_commit is not None:
                on_commit()
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        self.settle(ops, settled)
        await asyncio.shield(done)

    def _flush_settlements(self) -> None:
        batch, self._settling = self._settling, []
        ops = [op for unit, _ in batch for op in unit]
        try:
            committed_now = self.store.commit_now(ops)  # SqliteStore: on this thread when its writer is free
        except StoreWriteError as exc:
            _tell(batch, self._store_failed(exc))
            return
        if committed_now:
            self._store_succeeded()
            _tell(batch, None)
            return
        loop = self._running_loop()

        def committed(future: Future[None]) -> None:
            self._landed()
            error = future.exception()
            if error is not None:
                _tell(batch, self._store_failed(error))
                return
            self._store_succeeded()
            _tell(batch, None)

        future = self._submit(ops, durable=False)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(committed, f))

    async def barrier(self, verdicts_since: int) -> None:
        """Wait until every write submitted so far is durable (duplicates ack after their original)."""
        if self._in_flight:  # the empty unit's outcome is handled after every earlier one's
            await self.write([], verdicts_since=verdicts_since)
        elif self.failed_writes != verdicts_since:
            self.check_alive()
            raise StoreWriteError("a send this one was judged a duplicate of failed to store meanwhile; send again")

    def _submit(self, ops: Sequence[Op], durable: bool = True) -> Future[None]:
        future = self.store.submit(ops) if durable else self.store.submit(ops, durable=False)
        self._in_flight += 1
        if self._idle is not None:
            self._idle.clear()
        return future

    def _landed(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()

    def _store_failed(self, error: BaseException) -> StoreWriteError:
        """A write failed (on the loop): refuse work, log once, and reload from the store once writes are idle."""
        refusal = error if isinstance(error, StoreWriteError) else StoreWriteError(f"the message store failed: {error}")
        self.failed_writes += 1
        if self.failure is None:
            self.failure = refusal
            if not self._failure_logged:
                self._failure_logged = True
                _LOG.error("%s; refusing work until what the store holds is reloaded", refusal)
            self._recovery = self._running_loop().create_task(self._recover())
        return refusal

    def _store_succeeded(self) -> None:
        if self.failure is None and self._failure_logged:
            self._failure_logged = False
            self._recover_delay = RECOVER_FIRST_SECONDS
            _LOG.warning("the message store accepts writes again")

    async def _recover(self) -> None:
        """After a failed write: wait until no write is in flight, reload from the store, accept work again."""
        while True:
            await asyncio.sleep(self._recover_delay)
            self._recover_delay = min(self._recover_delay * 2, RECOVER_MAX_SECONDS)
            if self._idle is None:
                self._idle = asyncio.Event()
            if self._in_flight:
                self._idle.clear()
                await self._idle.wait()
            try:
                self._reload()
            except Exception as exc:
                _LOG.error("could not reload the store after a failed write (%s); trying again", exc)
                continue
            self.reloads += 1
            self.failure = None
            self._recovery = None
            self._reloaded()
            return


def _tell(batch: Settling, error: BaseException | None) -> None:
    """Each settlement's outcome to its waiter; one waiter's failure does not keep it from the others."""
    for _, done in batch:
        try:
            done(error)
        except Exception:
            _LOG.exception("a settlement's outcome could not be given")
