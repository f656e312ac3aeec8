import pytest
from confkit import Settings

TEXT = """
# server
port = 8080
debug = false
verbose = 0
cache = ON
color = yes
"""


def test_from_text_and_get():
    s = Settings.from_text(TEXT)
    assert s.get("port") == "8080"
    assert s.get_int("port") == 8080


def test_bad_line():
    with pytest.raises(ValueError):
        Settings.from_text("no equals sign")


def test_true_spellings():
    s = Settings.from_text(TEXT)
    assert s.get_bool("cache") is True
    assert s.get_bool("color") is True


def test_missing_bool_default():
    assert Settings({}).get_bool("debug", default=True) is True


def test_false_spellings():
    s = Settings.from_text(TEXT)
    assert s.get_bool("debug") is False
    assert s.get_bool("verbose") is False


def test_off_and_no():
    s = Settings({"a": "Off", "b": "NO"})
    assert s.get_bool("a", default=True) is False
    assert s.get_bool("b", default=True) is False
