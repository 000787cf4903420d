"""Small numeric helpers."""


def mean(values):
    """Return the arithmetic mean of a non-empty sequence of numbers."""
    if not values:
        raise ValueError("mean() of empty sequence")
    return sum(values) / len(values)


def median(values):
    """Return the median of a non-empty sequence of numbers.

    For an even number of values the median is the average of the two
    middle values. The input sequence is not modified.
    """
    if not values:
        raise ValueError("median() of empty sequence")
    ordered = list(values)
    mid = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[mid]
    return (ordered[mid] + ordered[mid + 1]) / 2


def clamp(value, low, high):
    """Limit value to the closed interval [low, high]."""
    return max(low, min(value, high))
