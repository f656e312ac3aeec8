import pytest
from envfile import parse_env


def test_plain_values():
    assert parse_env("A=1\n# comment\n\nexport B = two") == {"A": "1", "B": "two"}


def test_bad_line():
    with pytest.raises(ValueError):
        parse_env("just words")


def test_unbalanced_quote_kept():
    assert parse_env('A="open') == {"A": '"open'}


def test_double_quotes_removed():
    assert parse_env('GREETING="hello world"') == {"GREETING": "hello world"}


def test_single_quotes_removed():
    assert parse_env("NAME='bob'") == {"NAME": "bob"}
