"""Dedup keys of typed message ids: one-to-one, string keys unchanged; durations and times at their limits."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncebus.core.durations import TIMESPAN_MAX, TIMESPAN_MAX_TEXT, parse_duration
from oncebus.core.errors import ArgumentOutOfRangeError, InvalidArgumentError
from oncebus.core.keys import (
    MAX_ID_LENGTH,
    ULONG_MAX,
    DedupKey,
    dedup_key,
    id_text,
    key_text,
    migrate_key_text_v0,
    utf16_length,
)
from oncebus.core.timeutil import MAX_US, add_us, clamp_us, us_to_datetime

str_ids = st.text(min_size=1, max_size=MAX_ID_LENGTH)
nul_str_ids = st.text(max_size=MAX_ID_LENGTH - 1).map(lambda s: "\x00" + s)
message_ids = st.one_of(
    str_ids,
    nul_str_ids,
    st.binary(min_size=1, max_size=64),
    st.uuids(),
    st.integers(min_value=0, max_value=ULONG_MAX),
)
partition_keys = st.one_of(st.none(), str_ids, nul_str_ids)


def _typed(value: object) -> tuple[type, object]:
    return type(value), value


@given(message_ids, message_ids)
def test_two_different_ids_never_share_a_key_text(a: object, b: object) -> None:
    if _typed(a) != _typed(b):
        assert id_text(a) != id_text(b)  # type: ignore[arg-type]
        assert key_text(a, None) != key_text(b, None)  # type: ignore[arg-type]


@given(message_ids, partition_keys, message_ids, partition_keys)
def test_partitioned_keys_are_one_to_one(a: object, pa: str | None, b: object, pb: str | None) -> None:
    ka = dedup_key(a, pa, partitioned=True)  # type: ignore[arg-type]
    kb = dedup_key(b, pb, partitioned=True)  # type: ignore[arg-type]
    same = _typed(a) == _typed(b) and ka.partition_key == kb.partition_key
    assert (ka.text == kb.text) == same


@given(st.text(min_size=1, max_size=MAX_ID_LENGTH).filter(lambda s: not s.startswith("\x00")), st.none() | str_ids)
def test_string_keys_keep_the_text_stored_by_earlier_releases(message_id: str, partition_key: str | None) -> None:
    assert dedup_key(message_id).text == message_id
    if partition_key is not None and not partition_key.startswith("\x00"):
        assert dedup_key(message_id, partition_key, partitioned=True).text == (
            f"{len(partition_key)}:{partition_key}{message_id}"
        )


@given(st.one_of(str_ids, nul_str_ids), partition_keys, st.booleans())
def test_migrating_a_stored_key_gives_todays_key(message_id: str, partition_key: str | None, partitioned: bool) -> None:
    pk = (partition_key or message_id) if partitioned else None
    old = message_id if pk is None else f"{len(pk)}:{pk}{message_id}"  # the text schema 0 stored
    assert migrate_key_text_v0(old, partitioned=partitioned) == DedupKey(message_id, pk).text


def test_typed_key_texts() -> None:
    u = uuid.UUID(int=1)
    assert [id_text(v) for v in ("a", "\x00a", b"\x01\xff", u, 42)] == [
        "a",
        "\x00s\x00a",
        "\x00b01ff",
        "\x00u00000000-0000-0000-0000-000000000001",
        "\x00i42",
    ]
    assert key_text(b"\x01", "pk") == "2:pk\x00b01"
    assert key_text(7, 7) == "3:\x00i7\x00i7"


# ---------------------------------------------------------------------------------- durations and times
@pytest.mark.parametrize("text", ["P99999999999D", "P10675199DT2H48M6S", 1e308, 10**20, "99999999999.00:00:00"])
def test_a_duration_longer_than_timespan_max_is_refused(text: object) -> None:
    with pytest.raises(ArgumentOutOfRangeError, match=f"the longest duration is {TIMESPAN_MAX_TEXT}"):
        parse_duration(text, name="default_message_time_to_live")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "NaN"])
def test_a_duration_that_is_not_a_number_is_refused(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="lock_duration"):
        parse_duration(value, name="lock_duration")  # type: ignore[arg-type]


def test_the_longest_durations_parse() -> None:
    assert parse_duration(TIMESPAN_MAX_TEXT) == TIMESPAN_MAX
    assert parse_duration("P10675199D") == timedelta(days=10675199)


def test_time_arithmetic_past_year_9999_means_never() -> None:
    assert add_us(MAX_US - 10, 10) == MAX_US
    assert add_us(MAX_US - 10, 11) is None
    assert add_us(0, None) is None
    assert clamp_us(MAX_US + 5) == MAX_US
    assert us_to_datetime(MAX_US).year == 9999
    with pytest.raises(ArgumentOutOfRangeError, match="scheduled"):
        us_to_datetime(MAX_US + 1, name="scheduled")


@given(st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40))
def test_utf16_length_counts_code_units_as_dotnet_does(text: str) -> None:
    """Two units for a character outside the Basic Multilingual Plane, one for any other (a lone surrogate too)."""
    assert utf16_length(text) == sum(2 if ord(char) > 0xFFFF else 1 for char in text)


def test_utf16_length_of_ascii_astral_and_lone_surrogates() -> None:
    assert utf16_length("order-1") == 7
    assert utf16_length("\U0001f600x") == 3
    assert utf16_length("\ud800\u00e9") == 2
