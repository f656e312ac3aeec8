import pytest
from timefmt import format_duration, parse_duration


def test_hours_and_minutes():
    assert parse_duration("1h30m") == 5400


def test_unknown_unit():
    with pytest.raises(ValueError):
        parse_duration("3w")


def test_garbage():
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_format():
    assert format_duration(5400) == "1h30m"


def test_seconds():
    assert parse_duration("45s") == 45


def test_minutes_and_seconds():
    assert parse_duration("1m30s") == 90
    assert parse_duration("1h0m5s") == 3605
