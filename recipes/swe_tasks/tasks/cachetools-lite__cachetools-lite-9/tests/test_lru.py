import pytest
from cachelite import LRUCache


def test_evicts_oldest():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("c", 3)
    assert "a" not in c and len(c) == 2


def test_put_updates_value():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("a", 5)
    assert c.get("a") == 5 and len(c) == 1


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_get_missing_default():
    assert LRUCache(1).get("x", 7) == 7


def test_get_refreshes_recency():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    c.put("c", 3)
    assert "a" in c and "b" not in c
