import geometry


def largest(items):
    """Return the (name, shape) pair with the largest area."""
    return max(items, key=lambda item: geometry.calc_area(item[1]))


def count_bigger_than(items, threshold):
    """Count shapes whose area is strictly greater than threshold."""
    area = geometry.calc_area
    return sum(1 for _, shape in items if area(shape) > threshold)
