"""The rule and the entity model: pure Python, no I/O, no clocks (time is passed in)."""

from __future__ import annotations

from oncebus.core.dedup import DedupIndex, DuplicateDetector, Verdict, is_duplicate, judge_key_sends
from oncebus.core.durations import format_duration, parse_duration
from oncebus.core.entities import (
    QueueProperties,
    SubscriptionProperties,
    TopicProperties,
    validate_duplicate_window,
)
from oncebus.core.keys import DedupKey, dedup_key, validate_ids
from oncebus.core.tiers import Tier, TierQuotas

__all__ = [
    "DedupIndex",
    "DedupKey",
    "DuplicateDetector",
    "QueueProperties",
    "SubscriptionProperties",
    "Tier",
    "TierQuotas",
    "TopicProperties",
    "Verdict",
    "dedup_key",
    "format_duration",
    "is_duplicate",
    "judge_key_sends",
    "parse_duration",
    "validate_duplicate_window",
    "validate_ids",
]
