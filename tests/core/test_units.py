import pytest

from unbroken.core.units import format_duration, parse_duration


@pytest.mark.parametrize("text,seconds", [("5m", 300), ("60s", 60), ("1h", 3600), ("300", 300),
                                          ("1.5h", 5400), ("2d", 172800), (" 10 min ", 600)])
def test_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5q", "-5m", "m", "1e999", "five"])
def test_malformed_names_the_value(text):
    with pytest.raises(ValueError) as e:
        parse_duration(text)
    assert repr(text) in str(e.value)


def test_zero_only_where_allowed():
    with pytest.raises(ValueError):
        parse_duration("0")
    assert parse_duration("0s", allow_zero=True) == 0


def test_format_roundtrip():
    assert format_duration(300) == "5m"
    assert format_duration(3600) == "1h"
    assert format_duration(61) == "61s"
