"""A request's query parameters, parsed once; an error names the parameter and what it takes."""

from __future__ import annotations

from collections.abc import Mapping

from pytest_hemra.core.errors import HemraError


class BadRequest(HemraError):
    """A request the viewer cannot answer as asked (HTTP 400)."""


class NotFound(HemraError):
    """What a request names is not there (HTTP 404)."""


def integer(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"parameter {name!r}: {raw!r} is not an integer") from None
    if not low <= value <= high:
        raise BadRequest(f"parameter {name!r}: {value} is out of range (expected {low}..{high})")
    return value


def text(query: Mapping[str, str], name: str) -> str | None:
    """A text parameter; empty counts as absent."""
    value = query.get(name)
    return value if value else None


def required(query: Mapping[str, str], name: str) -> str:
    value = query.get(name)
    if not value:
        raise BadRequest(f"parameter {name!r} is required")
    return value
