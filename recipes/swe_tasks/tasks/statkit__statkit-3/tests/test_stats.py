import pytest
from statkit import mean, median, mode


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_median_odd():
    assert median([5, 1, 3]) == 3


def test_mode_tie_takes_smallest():
    assert mode([3, 1, 3, 1, 2]) == 1


def test_empty_raises():
    with pytest.raises(ValueError):
        median([])


def test_median_even():
    assert median([1, 2, 3, 4]) == 2.5


def test_median_even_unsorted():
    assert median([10, 2, 4, 8]) == 6
