"""Process settings for a long-running broker."""

from __future__ import annotations

import gc

# A broker holds many long-lived objects (every stored message); CPython's default collector
# (a young-generation pass every 700 allocations) then spends about a fifth of the broker's
# time re-scanning them. Fewer young collections cost a little memory and nothing else: the
# oldest generation is still collected whenever the heap has grown by a quarter.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    gc.freeze()  # what was loaded at start is not scanned again


def freeze_again() -> None:
    """After the stored messages were restored (after ready): they are not scanned again either, unless the
    collector is no longer tuned (a test process running serve in a thread puts its own settings back)."""
    if gc.get_threshold() == GC_THRESHOLDS:
        gc.freeze()
