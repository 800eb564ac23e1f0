"""Waiting for the store's writer thread to be idle, for tests that need ``commit_now`` to take the direct path."""

from __future__ import annotations

import time

from oncebus.store.sqlite import SqliteStore


def writer_idle(store: SqliteStore, timeout: float = 30.0) -> None:
    """Until the writer has committed everything submitted and let go of its lock.

    ``commit_now`` only tries the writer's lock (it never waits), and the writer holds it a moment after a unit's
    future is resolved (its sync and checkpoint come after) or while its timed sync runs: a test that asserts the
    direct path takes the lock here first. (The writer's idle check also takes it, once a second: a test that
    cannot have that turns it off with ``idle_seconds``.)"""
    deadline = time.monotonic() + timeout
    while True:
        with store._lock:
            if store._finished == store._submitted:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"the writer did not catch up within {timeout} s")
        time.sleep(0.001)
