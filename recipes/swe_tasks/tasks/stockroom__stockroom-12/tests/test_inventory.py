import pytest
from stockroom import Inventory


def make() -> Inventory:
    inv = Inventory()
    inv.add("bolt", 3)
    return inv


def test_add_and_count():
    inv = make()
    inv.add("bolt", 2)
    assert inv.count("bolt") == 5


def test_remove_all_drops_sku():
    inv = make()
    inv.remove("bolt", 3)
    assert inv.skus() == []


def test_quantity_must_be_positive():
    with pytest.raises(ValueError):
        make().remove("bolt", 0)


def test_remove_more_than_stock_raises():
    with pytest.raises(ValueError, match="bolt"):
        make().remove("bolt", 5)


def test_failed_remove_keeps_count():
    inv = make()
    with pytest.raises(ValueError):
        inv.remove("bolt", 5)
    assert inv.count("bolt") == 3


def test_remove_unknown_sku_raises():
    inv = make()
    with pytest.raises(ValueError):
        inv.remove("nut", 1)
    assert inv.skus() == ["bolt"]
