import pytest
from pager import Paginator


def test_exact_multiple():
    p = Paginator(range(20), per_page=10)
    assert p.num_pages == 2
    assert p.page(2) == list(range(10, 20))


def test_empty():
    assert Paginator([], per_page=5).num_pages == 0


def test_out_of_range():
    with pytest.raises(IndexError):
        Paginator(range(20), per_page=10).page(0)


def test_per_page_must_be_positive():
    with pytest.raises(ValueError):
        Paginator(range(3), per_page=0)


def test_partial_last_page_is_counted():
    assert Paginator(range(25), per_page=10).num_pages == 3


def test_partial_last_page_items():
    assert Paginator(range(25), per_page=10).page(3) == [20, 21, 22, 23, 24]
