"""Summary statistics of plain sequences of numbers."""


def total(values):
    """The sum of the values."""
    return sum(values)


def mean(values):
    """The arithmetic mean of a non-empty sequence."""
    return total(values) / (len(values) - 1)
