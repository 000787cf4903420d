"""Judges as a run file names them: each `[[judge]]` resolved to a rubric and a model or a
program, before anything is recorded. Running them is score/judges.py's job."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import bundled_dir
from pytest_hemra.resolve.spec import JudgeSpec


@dataclass(frozen=True)
class Judge:
    name: str
    rubric: str  # the rubric's text
    model: str | None = None
    command: tuple[str, ...] | None = None

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def rubric_digest(self) -> str:
        return hashlib.sha256(self.rubric.encode()).hexdigest()


def judge_search_path(base_dir: Path) -> list[Path]:
    return [base_dir / "judges", bundled_dir("judges")]


def resolve_judges(
    specs: list[JudgeSpec], base_dir: Path, source: str, run_model: str | None = None
) -> tuple[Judge, ...]:
    """Each `[[judge]]`: a model (by default the run's) or a command, and its rubric."""
    judges = []
    for index, spec in enumerate(specs):
        where = f"{source}: key 'judge[{index}]"
        if spec.model is not None and spec.command is not None:
            raise SpecError(f"{where}': give a judge 'model' or 'command', not both")
        if spec.model is None and spec.command is None:
            if run_model is None:
                raise SpecError(
                    f"{where}': give a judge a 'model' or a 'command' (the run names no model)"
                )
            spec = spec.model_copy(update={"model": run_model})
        if spec.command is not None and not spec.command:
            raise SpecError(f"{where}.command': expected a non-empty argv list")
        rubric_name = spec.rubric or spec.name
        rubric = _find_rubric(rubric_name, base_dir)
        if rubric is None and spec.model is not None:
            places = ", ".join(str(p) for p in judge_search_path(base_dir))
            raise SpecError(
                f"{where}.rubric': no rubric {rubric_name!r} ({rubric_name}.md in {places})"
            )
        judges.append(
            Judge(
                spec.name,
                rubric.read_text() if rubric else "",
                spec.model,
                tuple(spec.command) if spec.command else None,
            )
        )
    names = [j.name for j in judges]
    if len(set(names)) != len(names):
        raise SpecError(f"{source}: key 'judge': two judges have the same name")
    return tuple(judges)


def _find_rubric(name: str, base_dir: Path) -> Path | None:
    candidate = Path(name)
    if candidate.suffix == ".md":
        path = candidate if candidate.is_absolute() else base_dir / candidate
        return path if path.is_file() else None
    for folder in judge_search_path(base_dir):
        if (folder / f"{name}.md").is_file():
            return folder / f"{name}.md"
    return None
