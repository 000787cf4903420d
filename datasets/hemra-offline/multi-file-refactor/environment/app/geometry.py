"""Shapes are plain dicts: {"kind": "rect", "w": .., "h": ..},
{"kind": "circle", "r": ..} or {"kind": "triangle", "base": .., "h": ..}."""
import math


def calc_area(shape):
    """Return the area of a single shape."""
    kind = shape["kind"]
    if kind == "rect":
        return shape["w"] * shape["h"]
    if kind == "circle":
        return math.pi * shape["r"] ** 2
    if kind == "triangle":
        return 0.5 * shape["base"] * shape["h"]
    raise ValueError(f"unknown shape kind: {kind}")


def total_area(shapes):
    """Return the summed area of all shapes."""
    return sum(calc_area(s) for s in shapes)
