"""The flags that override a run file, once for both faces: `hemra run -H NAME` and pytest's
`--hemra-harness NAME` are one row of `OVERRIDE_FLAGS`, read into one `Overrides`.

Light on purpose (no pydantic): the pytest options module and `hemra --help` import it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Overrides:
    """`hemra run` / `--hemra-*` flags: the first group replaces run-file keys, the rest add."""

    harnesses: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    attempts: int | None = None
    tasks: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    baseline: str | None = None
    concurrency: int | None = None
    sandbox: str | None = None
    require: list[str] = field(default_factory=list)
    verifier_env: list[str] = field(default_factory=list)
    pass_env: list[str] = field(default_factory=list)
    keep_agent_processes: list[str] = field(default_factory=list)
    judges: list[str] = field(default_factory=list)

    def apply(self, data: dict[str, Any]) -> dict[str, Any]:
        merged = dict(data)
        for key, value in (
            ("harnesses", self.harnesses),
            ("datasets", self.datasets),
            ("tasks", self.tasks),
            ("exclude", self.exclude),
        ):
            if value:
                merged[key] = list(value)
        if self.models:  # one: the one-model form; several: every harness under each
            merged.pop("model", None)
            merged.pop("models", None)
            merged.update({"model": self.models[0]} if len(self.models) == 1 else {})
            merged.update({"models": list(self.models)} if len(self.models) > 1 else {})
        for key, scalar in (
            ("attempts", self.attempts),
            ("baseline", self.baseline),
            ("concurrency", self.concurrency),
        ):
            if scalar is not None:
                merged[key] = scalar
        if self.sandbox is not None:
            merged["sandbox"] = {**_table(merged.get("sandbox")), "provider": self.sandbox}
        if self.require:
            merged["require"] = [*_list(merged.get("require")), *self.require]
        if self.verifier_env:
            verifier = _table(merged.get("verifier"))
            verifier["env"] = [*_list(verifier.get("env")), *self.verifier_env]
            merged["verifier"] = verifier
        if self.pass_env:
            table = _table(merged.get("sandbox"))
            table["pass_env"] = [*_list(table.get("pass_env")), *self.pass_env]
            merged["sandbox"] = table
        if self.keep_agent_processes:
            verifier = _table(merged.get("verifier"))
            kept = verifier.get("keep_agent_processes")
            if kept is not True:  # `true` keeps every task's already
                kept = _list(kept) if isinstance(kept, list) else []
                verifier["keep_agent_processes"] = [*kept, *self.keep_agent_processes]
            merged["verifier"] = verifier
        if self.judges:
            merged["judge"] = [*_list(merged.get("judge")), *({"name": j} for j in self.judges)]
        return merged


def _table(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def positive_int(text: str) -> int:
    """A count of 1 or more (`--concurrency 0` would run nothing, silently)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


@dataclass(frozen=True)
class OverrideFlag:
    """One `Overrides` field as each face spells it: pytest's `option`, `hemra run`'s `flags`.
    A repeatable flag collects a list; the others take one value of `type`."""

    field: str
    option: str
    flags: tuple[str, ...]
    metavar: str
    help: str
    repeats: bool = True
    type: Callable[[str], Any] = str

    @property
    def dest(self) -> str:
        """The pytest option's name in `config.getoption`."""
        return self.option.removeprefix("--").replace("-", "_")


OVERRIDE_FLAGS = (
    OverrideFlag(
        "harnesses",
        "--hemra-harness",
        ("-H", "--harness"),
        "NAME",
        "harness to evaluate, replaces the run file's (repeatable)",
    ),
    OverrideFlag(
        "datasets",
        "--hemra-dataset",
        ("-d", "--dataset"),
        "NAME",
        "dataset name, name@version (registry), name@digest or path; replaces the run file's",
    ),
    OverrideFlag(
        "models",
        "--hemra-model",
        ("-m", "--model"),
        "NAME",
        "model the harnesses run under, replaces the run file's model(s); repeated: every"
        " harness under each (a harness x model matrix)",
    ),
    OverrideFlag(
        "attempts",
        "--hemra-attempts",
        ("--attempts",),  # not -k: pytest's selection, in `hemra run` as in pytest
        "N",
        "attempts per task",
        repeats=False,
        type=int,
    ),
    OverrideFlag(
        "tasks", "--hemra-task", ("-t", "--task"), "GLOB", "select tasks by name (replaces 'tasks')"
    ),
    OverrideFlag(
        "exclude",
        "--hemra-exclude",
        ("-x", "--exclude"),
        "GLOB",
        "exclude tasks by name (replaces 'exclude')",
    ),
    OverrideFlag(
        "baseline",
        "--hemra-baseline",
        ("--baseline",),
        "NAME",
        "harness others are compared to",
        repeats=False,
    ),
    OverrideFlag(
        "concurrency",
        "--hemra-concurrency",
        ("--concurrency",),
        "N",
        "trials at once (threads of each pytest process; with -n, shared out among the"
        " workers); replaces the run file's 'concurrency'",
        repeats=False,
        type=positive_int,
    ),
    OverrideFlag(
        "sandbox", "--hemra-sandbox", ("--sandbox",), "PROVIDER", "sandbox provider", repeats=False
    ),
    OverrideFlag(
        "require",
        "--hemra-require",
        ("--require",),
        "CAPABILITY",
        "sandbox capability the run needs (adds to 'require')",
    ),
    OverrideFlag(
        "verifier_env",
        "--hemra-verifier-env",
        ("--verifier-env",),
        "NAME",
        "environment variable passed to verifiers (adds to verifier.env)",
    ),
    OverrideFlag(
        "pass_env",
        "--hemra-pass-env",
        ("--pass-env",),
        "NAME",
        "runner variable a task's env templates may read (adds to sandbox.pass_env)",
    ),
    OverrideFlag(
        "keep_agent_processes",
        "--hemra-keep-agent-processes",
        ("--keep-agent-processes",),
        "NAME",
        "dataset or dataset::task whose verifier finds the agent's processes running (adds to"
        " verifier.keep_agent_processes)",
    ),
    OverrideFlag(
        "judges",
        "--hemra-judge",
        ("--judge",),
        "NAME",
        "judge to run after the verifier (adds to 'judge')",
    ),
)


def read_overrides(value: Callable[[OverrideFlag], Any]) -> Overrides:
    """The `Overrides` a face was given: `value(flag)` is that flag's parsed value."""
    return Overrides(**{flag.field: value(flag) for flag in OVERRIDE_FLAGS})
