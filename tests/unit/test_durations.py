"""Durations and points in time."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from metricvault.durations import (
    parse_duration_ms,
    parse_retention_ms,
    parse_seconds,
    parse_time_ms,
)
from metricvault.errors import TimeRangeError

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("text", "ms"),
    [("5s", 5000), ("1m", 60000), ("1h30m", 5_400_000), ("30d", 2_592_000_000), (250, 250)],
)
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "5", "5x", "-5s", "0s", "1h 2"])
def test_bad_durations(text):
    with pytest.raises(TimeRangeError):
        parse_duration_ms(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2s", 2.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("2", 2.0),
        ("0.5", 0.5),
        ("0", 0.0),
        ("0s", 0.0),
    ],
)
def test_command_line_seconds_take_units_or_plain_seconds(text, seconds):
    assert parse_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "-1", "-2s", "inf", "nan", "2 s x"])
def test_bad_command_line_seconds_say_which_forms_work(text):
    with pytest.raises(TimeRangeError, match="unit"):
        parse_seconds(text)


def test_retention_forever():
    assert parse_retention_ms("forever") is None
    assert parse_retention_ms("30d") == 30 * 86_400_000


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("now", NOW),
        ("-1h", NOW - 3_600_000),
        ("-30d", NOW - 30 * 86_400_000),
        ("2026-01-01T00:00:00Z", NOW),
        ("2026-01-01T01:00:00+01:00", NOW),
        ("2026-01-01", NOW),
        (datetime(2026, 1, 1, tzinfo=UTC), NOW),
        (datetime(2026, 1, 1), NOW),
        (date(2026, 1, 1), NOW),
        (NOW, NOW),
        (str(NOW), NOW),
    ],
)
def test_times(value, ms):
    assert parse_time_ms(value, now=NOW) == ms


def test_bad_time_says_what_forms_work():
    with pytest.raises(TimeRangeError, match="ISO-8601"):
        parse_time_ms("yesterday-ish", now=NOW)
