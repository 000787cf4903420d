"""Harnesses: harness files found by name, their digests, kinds, and the argv they run.

`harnesses/<name>.toml` is looked up beside the run file, then in the bundled `harnesses/`.
`computer-use` is refused at resolve; every other kind runs.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import bundled_dir
from pytest_hemra.resolve.spec import (
    PLACEHOLDER_PATTERN,
    HarnessSpec,
    is_valid_name,
    load_harness_spec,
)

UNSUPPORTED_BECAUSE = {
    "computer-use": (
        ": a computer-use agent acts on a screen through a model that reads screenshots, and"
        " HEMRA's sandboxes have no display and its offline scripted model cannot read one"
    ),
}
RUNNABLE_KINDS = frozenset({"program", "cli", "sdk", "acp", "harbor"})
HARBOR_PACKAGE = re.compile(r"^pypi:harbor==[A-Za-z0-9.+!-]+$")
# keys that say how HEMRA runs an agent in its own sandbox: Harbor runs its agent itself
NOT_FOR_HARBOR = (
    "command", "install", "provider", "key_env", "uses_solution", "environment", "files",
    "output", "entry", "finish_command", "edit_format",
)  # fmt: skip


@dataclass(frozen=True)
class Harness:
    name: str
    path: Path
    spec: HarnessSpec

    @property
    def digest(self) -> str:
        """The harness file's digest, and for `entry = "file.py:..."` that file's too."""
        location = (self.spec.entry or "").partition(":")[0]
        code = self.path.parent / location
        if not location.endswith(".py") or not code.is_file():
            return self.spec.digest()
        joined = self.spec.digest() + hashlib.sha256(code.read_bytes()).hexdigest()
        return hashlib.sha256(joined.encode()).hexdigest()


def harness_search_path(base_dir: Path) -> list[Path]:
    return [base_dir / "harnesses", bundled_dir("harnesses")]


def find_harness(name: str, base_dir: Path, source: str) -> Path:
    if not is_valid_name(name):
        raise SpecError(f"{source}: key 'harnesses': {name!r} is not a valid harness name")
    searched = harness_search_path(base_dir)
    for folder in searched:
        candidate = folder / f"{name}.toml"
        if candidate.is_file():
            return candidate.resolve()
    where = ", ".join(str(f) for f in searched)
    raise SpecError(f"{source}: key 'harnesses': no harness named {name!r} (looked in {where})")


def resolve_harness(name: str, base_dir: Path, source: str, run_model: str | None) -> Harness:
    """Load a harness file and check it can run in this run; every refusal names the file."""
    path = find_harness(name, base_dir, source)
    spec = load_harness_spec(path)
    if spec.kind not in RUNNABLE_KINDS:
        why = UNSUPPORTED_BECAUSE.get(spec.kind, "")
        raise SpecError(
            f"{path}: key 'kind': harness kind {spec.kind!r} is not supported yet by this "
            f"version of HEMRA{why} (supported: {', '.join(sorted(RUNNABLE_KINDS))})"
        )
    if spec.kind == "harbor":
        _check_harbor(path, spec)
    elif spec.agent is not None:
        raise SpecError(f"{path}: key 'agent' applies only to a harbor harness (kind = \"harbor\")")
    if spec.kind == "sdk" and not spec.entry:
        raise SpecError(f"{path}: key 'entry' is required for an sdk harness (module:function)")
    if spec.kind not in ("sdk", "harbor") and not spec.command:
        raise SpecError(f"{path}: key 'command' is required for a {spec.kind} harness")
    if run_model and spec.model and spec.model != run_model:
        raise SpecError(
            f"{path}: key 'model': harness pins model {spec.model!r} but the run "
            f"({source}) asks for {run_model!r}"
        )
    missing = [variable for variable in spec.env if variable not in os.environ]
    if missing:
        raise SpecError(
            f"{path}: key 'env': needs environment variable {missing[0]}, which is not set"
        )
    return Harness(name=name, path=path, spec=spec)


def _check_harbor(path: Path, spec: HarnessSpec) -> None:
    """A harbor harness names Harbor's agent and the Harbor release, and nothing that only
    HEMRA's own sandbox would use."""
    if not spec.agent:
        raise SpecError(
            f"{path}: key 'agent' is required for a harbor harness (the Harbor agent to run,"
            ' e.g. "oracle")'
        )
    if spec.package is None or not HARBOR_PACKAGE.match(spec.package):
        got = "" if spec.package is None else f", got {spec.package!r}"
        raise SpecError(
            f"{path}: key 'package': a harbor harness names the Harbor release it runs,"
            f' e.g. "pypi:harbor==0.26.0"{got}'
        )
    for key in NOT_FOR_HARBOR:
        if getattr(spec, key):
            raise SpecError(
                f"{path}: key {key!r} does not apply to a harbor harness (Harbor runs agent"
                f" {spec.agent!r} in its own container)"
            )


def render(text: str, values: Mapping[str, str]) -> str:
    """Fill the `{placeholder}`s of one string; unknown ones stay as written."""
    return PLACEHOLDER_PATTERN.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def render_argv(argv: list[str], values: Mapping[str, str]) -> list[str]:
    """Fill `{placeholder}`s in each argument; the argv stays a list, never a shell string."""
    return [render(arg, values) for arg in argv]


def observability(harness: Harness) -> dict[str, str]:
    """What HEMRA can see of a harness: usage at the wire, its own numbers, a transcript."""
    spec = harness.spec
    calls_models = spec.kind in ("cli", "acp", "sdk")
    return {
        "gateway usage": "yes" if calls_models else "no model calls",
        "self-reported usage": spec.output or "no",
        "transcript": "from the gateway's calls" if calls_models else "no",
    }


def available_harnesses(base_dir: Path) -> list[Path]:
    """Every harness file a run beside `base_dir` can name (a local one hides a bundled one)."""
    found: dict[str, Path] = {}
    for folder in reversed(harness_search_path(base_dir)):
        for path in sorted(folder.glob("*.toml")):
            found[path.stem] = path
    return [found[name] for name in sorted(found)]
