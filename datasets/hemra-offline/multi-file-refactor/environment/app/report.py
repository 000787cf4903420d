from geometry import calc_area


def format_line(name, shape):
    """One report line: the shape name, its kind and its area."""
    return f"{name:<10} {shape['kind']:<9} {calc_area(shape):>8.2f}"


def format_report(items):
    """Format (name, shape) pairs as report lines, smallest area first."""
    ordered = sorted(items, key=lambda item: calc_area(item[1]))
    return [format_line(name, shape) for name, shape in ordered]
