"""A receivable's settings are updated in place, every field (the receivable and its readers hold the object)."""

from __future__ import annotations

import dataclasses

from oncebus.broker.receivable import ReceivableSettings


def test_update_takes_every_field_in_place() -> None:
    held = ReceivableSettings(5_000_000, 10, False, False, 1 << 30)
    new = ReceivableSettings(7_000_000, 3, True, True, 1 << 20)
    assert all(getattr(held, f.name) != getattr(new, f.name) for f in dataclasses.fields(ReceivableSettings))
    same = held
    held.update(new)
    assert same is held
    assert dataclasses.astuple(held) == dataclasses.astuple(new)
