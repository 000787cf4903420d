"""Harnesses: harness files found by name, their digests, kinds, and the argv they run.

`harnesses/<name>.toml` is looked up beside the run file, then in the bundled `harnesses/`.
A harness's `kind` is one the plug-in registry holds (`core/registry.py`), and the kind checks
the rest of the file; `computer-use` is refused at resolve with the reason why.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.core import registry
from pytest_hemra.core.errors import SpecError
from pytest_hemra.core.names import unknown_name
from pytest_hemra.resolve.datasets import bundled_dir
from pytest_hemra.resolve.harness_spec import (
    PLACEHOLDER_PATTERN,
    HarnessSpec,
    load_harness_spec,
)
from pytest_hemra.resolve.validation import is_valid_name

UNSUPPORTED_BECAUSE = {
    "computer-use": (
        ": a computer-use agent acts on a screen through a model that reads screenshots, and"
        " HEMRA's sandboxes have no display and its offline scripted model cannot read one"
    ),
}


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
    """The folders a harness name is looked up in, first found first: the run's own, then the
    bundled ones (once, when they are the same folder, as in a checkout)."""
    folders = [base_dir / "harnesses", bundled_dir("harnesses")]
    return list(dict.fromkeys(folder.resolve() for folder in folders))


def find_harness(name: str, base_dir: Path, source: str) -> Path:
    if not is_valid_name(name):
        raise SpecError(f"{source}: key 'harnesses': {name!r} is not a valid harness name")
    searched = harness_search_path(base_dir)
    for folder in searched:
        candidate = folder / f"{name}.toml"
        if candidate.is_file():
            return candidate.resolve()
    where = ", ".join(str(f) for f in searched)
    known = [path.stem for path in available_harnesses(base_dir)]
    raise SpecError(
        f"{source}: key 'harnesses': {unknown_name('harness', name, known)}; looked in {where}"
    )


def resolve_harness(name: str, base_dir: Path, source: str, run_model: str | None) -> Harness:
    """Load a harness file and check it can run in this run; every refusal names the file."""
    path = find_harness(name, base_dir, source)
    spec = load_harness_spec(path)
    kinds = registry.harness_kinds()
    if spec.kind not in kinds:
        supported = sorted(kinds)
        if spec.kind in UNSUPPORTED_BECAUSE:
            raise SpecError(
                f"{path}: key 'kind': harness kind {spec.kind!r} is not supported yet by this "
                f"version of HEMRA{UNSUPPORTED_BECAUSE[spec.kind]} (supported: "
                f"{', '.join(supported)})"
            )
        listed = [repr(name) for name in kinds]
        expected = listed[0] if len(listed) == 1 else f"{', '.join(listed[:-1])} or {listed[-1]}"
        raise SpecError(f"{path}: key 'kind': input should be {expected}, got {spec.kind!r}")
    kinds[spec.kind].validate(path, spec)
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


def render(text: str, values: Mapping[str, str]) -> str:
    """Fill the `{placeholder}`s of one string; unknown ones stay as written."""
    return PLACEHOLDER_PATTERN.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def render_argv(argv: list[str], values: Mapping[str, str]) -> list[str]:
    """Fill `{placeholder}`s in each argument; the argv stays a list, never a shell string."""
    return [render(arg, values) for arg in argv]


def observability(harness: Harness) -> dict[str, str]:
    """What HEMRA can see of a harness: usage at the wire, its own numbers, a transcript."""
    spec = harness.spec
    calls_models = bool(getattr(registry.harness_kinds().get(spec.kind), "calls_models", False))
    return {
        "gateway usage": "yes" if calls_models else "no model calls",
        "self-reported usage": spec.output or "no",
        "transcript": "from the gateway's calls" if calls_models else "no",
    }


def is_isolated(spec: HarnessSpec) -> bool:
    """Whether the harness's kind runs its agent in HEMRA's sandbox (a plug-in kind that does
    not say is taken to: it runs through HEMRA's sandbox provider)."""
    return bool(getattr(registry.harness_kinds().get(spec.kind), "is_isolated", True))


def available_harnesses(base_dir: Path) -> list[Path]:
    """Every harness file a run beside `base_dir` can name (a local one hides a bundled one)."""
    found: dict[str, Path] = {}
    for folder in reversed(harness_search_path(base_dir)):
        for path in sorted(folder.glob("*.toml")):
            found[path.stem] = path
    return [found[name] for name in sorted(found)]
