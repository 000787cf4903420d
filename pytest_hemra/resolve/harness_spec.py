"""A harness file, `harnesses/<name>.toml`: its pydantic model, the placeholders its command may
use, and its digest; `harnesses.py` finds the files by name. See docs/harnesses.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from pytest_hemra.resolve.validation import Strict, check_env_names, parse_model, read_toml

PLACEHOLDER_PATTERN = re.compile(r"\{([a-z_]+)\}")
PLACEHOLDERS = frozenset(
    {
        "instruction",
        "instruction_file",
        "model",
        "workdir",
        "logs_dir",
        "deadline",
        "timeout_secs",
        "base_url",
        "api_key",
        "harness_dir",
        "home",
        "mcp_servers_json",
        "mcp_servers_toml",
    }
)
PACKAGE_PATTERN = r"^(npm|pypi):[^\s]+$"
ADDED_HARNESS_KEYS = (
    "edit_format",
    "agent",
    "output_file",
    "skills_dir",
)  # harness keys left out of digests while unset


def _check_placeholders(text: str) -> None:
    for found in PLACEHOLDER_PATTERN.findall(text):
        if found not in PLACEHOLDERS:
            raise ValueError(
                f"unknown placeholder {{{found}}} (expected one of "
                + ", ".join("{" + p + "}" for p in sorted(PLACEHOLDERS))
                + ")"
            )


class HarnessSpec(Strict):
    """A harness file, `harnesses/<name>.toml`; see docs/harnesses.md."""

    kind: str  # a registered harness kind (`core/registry.py`), checked at resolve
    description: str = ""
    version: str | None = None
    command: list[str] = Field(default_factory=list)
    install: list[list[str]] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)
    model: str | None = None
    provider: str | None = None
    key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    uses_solution: bool = False
    package: str | None = Field(default=None, pattern=PACKAGE_PATTERN)
    environment: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    output: Literal["claude-code", "codex", "pi", "mini-swe-agent", "aider"] | None = None
    output_file: str | None = None  # where `output` is read from in the sandbox (else stdout)
    entry: str | None = Field(default=None, pattern=r"^[\w./-]+:[A-Za-z_]\w*$")
    finish_command: str | None = None  # how the agent declares it is done (scripted replays)
    # no tools: the harness edits files from blocks in the model's text reply, in this format
    edit_format: Literal["whole"] | None = None
    # harbor kind: the Harbor agent that runs (`harbor run -a AGENT`), e.g. "oracle"
    agent: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][\w.:@/-]*$")
    # where the agent loads skills from (placeholders allowed): a task's `skills_dir` is
    # copied there before its turn
    skills_dir: str | None = None

    _env = field_validator("env")(check_env_names)

    @field_validator("command")
    @classmethod
    def _known_placeholders(cls, argv: list[str]) -> list[str]:
        for arg in argv:
            _check_placeholders(arg)
        return argv

    @field_validator("skills_dir")
    @classmethod
    def _known_placeholders_in_path(cls, path: str | None) -> str | None:
        if path is not None:
            _check_placeholders(path)
        return path

    @field_validator("environment", "files")
    @classmethod
    def _known_placeholders_in_values(cls, table: dict[str, str]) -> dict[str, str]:
        for key, value in table.items():
            _check_placeholders(key)
            _check_placeholders(value)
        return table

    def digest(self) -> str:
        """sha256 of the canonical content: the same file gives the same digest anywhere. A key
        added since digests were first recorded counts only when set, so adding one changes no
        existing harness's digest (nor its install)."""
        unset = {key for key in ADDED_HARNESS_KEYS if getattr(self, key) is None}
        content = self.model_dump(mode="json", exclude=unset)
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def load_harness_spec(path: Path) -> HarnessSpec:
    return parse_model(HarnessSpec, read_toml(path), str(path), "harness setting")
