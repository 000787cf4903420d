"""The edge of run and harness files: reading TOML, validating it against a pydantic model, and
the one-line error naming the file, the key and what was expected (with a close match for a
misspelt key). Also the checks several files' models share: names and environment variable names.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_hemra.core.errors import SpecError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
M = TypeVar("M", bound="BaseModel")


def is_valid_name(name: str) -> bool:
    """Whether `name` may become a path component or part of a container name."""
    return bool(NAME_PATTERN.match(name))


def check_name(value: str) -> str:
    if not is_valid_name(value):
        raise ValueError(
            "expected a name of letters, digits, '.', '_' or '-' not starting with '.' or '-'"
        )
    return value


def check_env_names(values: list[str]) -> list[str]:
    for value in values:
        if not ENV_NAME_PATTERN.match(value):
            raise ValueError(f"expected environment variable names, got {value!r}")
    return values


class Strict(BaseModel):
    """A table of a run or harness file: unknown keys and loose types refused, frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file or raise a SpecError naming it."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{path}: not valid TOML ({error})") from None


def parse_model(model: type[M], data: dict[str, Any], source: str, noun: str) -> M:
    """Validate `data` against `model`; the first problem becomes a one-line SpecError."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise SpecError(f"{source}: {describe_error(model, error, noun)}") from None


def describe_error(model: type[BaseModel], error: ValidationError, noun: str) -> str:
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    key = _dotted(first["loc"])
    if first["type"] == "extra_forbidden":
        known = _known_keys(model, loc[:-1])
        hint = difflib.get_close_matches(loc[-1], known, n=1)
        parent = _dotted(first["loc"][:-1])
        suggestion = f" (did you mean '{parent + '.' if parent else ''}{hint[0]}'?)" if hint else ""
        return f"key '{key}' is not a {noun}{suggestion}"
    if first["type"] == "missing":
        return f"key '{key}' is required"
    message = first["msg"]
    message = message.removeprefix("Value error, ")
    got = first.get("input")
    shown = "" if isinstance(got, dict | list) else f", got {got!r}"
    return f"key '{key}': {message[0].lower()}{message[1:]}{shown}"


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _known_keys(model: type[BaseModel], path: list[str]) -> list[str]:
    current: Any = model
    for part in path:
        if part.isdigit():
            continue
        info = current.model_fields.get(part) if hasattr(current, "model_fields") else None
        if info is None:
            return []
        annotation = info.annotation
        args = getattr(annotation, "__args__", ())
        current = next((a for a in (annotation, *args) if hasattr(a, "model_fields")), None)
        if current is None:
            return []
    return list(current.model_fields)
