from stats_lib.stats import mean, total


def test_mean_of_two():
    assert mean([2, 4]) == 3


def test_mean_of_three():
    assert mean([1, 2, 6]) == 3


def test_total():
    assert total([1, 2, 3]) == 6
