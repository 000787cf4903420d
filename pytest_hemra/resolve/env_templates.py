"""The `${VAR}` and `${VAR:-default}` templates of task.toml's env tables: their syntax, checked
when the task is read, and filling them. Which runner variables they may read is
`templates.py`'s business.
"""

from __future__ import annotations

import re

TEMPLATE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env(env: dict[str, str]) -> dict[str, str]:
    """Names are variable names; values are text, `${VAR}` and `${VAR:-default}` read from the
    runner's environment when the trial runs."""
    for name, value in env.items():
        if not ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        rest = TEMPLATE.sub("", value)
        if "${" in rest:
            raise ValueError(f"{name}: {value!r} holds a '${{' that is not ${{VAR}} or ${{VAR:-x}}")
    return env


def template_names(env: dict[str, str]) -> dict[str, bool]:
    """The runner's variables `env`'s values read, each with whether it has a default."""
    found: dict[str, bool] = {}
    for value in env.values():
        for match in TEMPLATE.finditer(value):
            has_default = match.group("default") is not None
            found[match.group("name")] = found.get(match.group("name"), True) and has_default
    return found


def render_env(env: dict[str, str], source: dict[str, str]) -> dict[str, str]:
    """`env` with its `${VAR}` / `${VAR:-default}` templates filled from `source`."""

    def fill(match: re.Match[str]) -> str:
        name, default = match.group("name"), match.group("default")
        value = source.get(name)
        return value if value else (default or "")

    return {name: TEMPLATE.sub(fill, value) for name, value in env.items()}
