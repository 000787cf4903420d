"""Datasets in the Harbor task format: lookup, task parsing, selection, digests and pins.

A dataset is a folder of task folders, found by name (`datasets/` beside the run file, then
`HEMRA_DATASETS_PATH`, then the bundled datasets), by path, or as `name@version` in the registry
(`registry.py`; its tasks fetched into the cache by `cache.py`). Its digest covers the sorted
relative paths and file hashes of the selected tasks, so it is the same on every machine.
Tasks are selected by folder name before any is parsed: a task a run leaves out is never read,
so one HEMRA would refuse does not stop it.

A task's files are read, hashed, sent to models and copied into sandboxes, so a link in a task
folder that leads out of it (to a host file) is refused when the task is loaded; a link that
stays inside is hashed as the link it is, never followed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.core.errors import SpecError
from pytest_hemra.core.names import unknown_name
from pytest_hemra.resolve.cache import fetch_dataset
from pytest_hemra.resolve.compose import Compose, compose_file, load_compose
from pytest_hemra.resolve.registry import listed_dataset
from pytest_hemra.resolve.taskconfig import TaskConfig, unknown_keys
from pytest_hemra.resolve.validation import is_valid_name, parse_model, read_toml

IGNORED_PARTS = frozenset({"__pycache__", ".git", ".DS_Store", ".pytest_cache"})
PIN_PATTERN = re.compile(r"^(?P<name>[^@]+)@(?P<digest>[0-9a-f]{6,64})$")


@dataclass(frozen=True)
class Task:
    name: str
    path: Path
    config: TaskConfig
    instruction: str
    warnings: tuple[str, ...] = ()  # keys of its task.toml that no table defines, by name
    compose: Compose | None = None  # environment/docker-compose.yaml: services beside main

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def has_dockerfile(self) -> bool:
        return (self.environment_dir / "Dockerfile").is_file()

    @property
    def has_solution(self) -> bool:
        """A reference solution: `solution/solve.sh`, or one per step of a multi-step task."""
        if self.config.steps:
            return all(
                (self.path / "steps" / step.name / "solution" / "solve.sh").is_file()
                for step in self.config.steps
            )
        return (self.path / "solution" / "solve.sh").is_file()

    def environment_digest(self) -> str:
        """Content digest of what builds the task image: a rebuild only when this changes."""
        digest = hashlib.sha256()
        digest.update(f"image:{self.config.environment.docker_image}\n".encode())
        if self.environment_dir.is_dir():
            digest.update(tree_digest(self.environment_dir, [self.environment_dir]).encode())
        return digest.hexdigest()


@dataclass(frozen=True)
class Dataset:
    name: str
    path: Path
    digest: str
    tasks: tuple[Task, ...]


def bundled_dir(kind: str) -> Path:
    """The bundled `datasets/` or `harnesses/`: inside the wheel, or the source checkout."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "_bundled" / kind
    return installed if installed.is_dir() else package.parent / kind


def dataset_search_path(base_dir: Path) -> list[Path]:
    """The folders a dataset name is looked up in, first found first: the run's own,
    `HEMRA_DATASETS_PATH`'s, then the bundled ones (each once)."""
    extra = [Path(p) for p in os.environ.get("HEMRA_DATASETS_PATH", "").split(os.pathsep) if p]
    folders = [base_dir / "datasets", *extra, bundled_dir("datasets")]
    return list(dict.fromkeys(folder.resolve() for folder in folders))


def find_dataset(ref: str, base_dir: Path, source: str) -> Path:
    """A dataset folder by path (contains '/' or starts with '.') or by name on the search path."""
    if "/" in ref or ref.startswith(".") or "\\" in ref:
        path = (base_dir / ref).resolve()
        if not path.is_dir():
            raise SpecError(f"{source}: key 'datasets': no dataset folder at {path}")
        return path
    if not is_valid_name(ref):
        raise SpecError(f"{source}: key 'datasets': {ref!r} is not a valid dataset name")
    searched = dataset_search_path(base_dir)
    for folder in searched:
        if (folder / ref).is_dir():
            return (folder / ref).resolve()
    where = ", ".join(str(f) for f in searched)
    known = [
        p.name for folder in searched if folder.is_dir() for p in folder.iterdir() if p.is_dir()
    ]
    raise SpecError(
        f"{source}: key 'datasets': {unknown_name('dataset', ref, known)}; looked in {where}"
    )


def resolve_dataset(
    ref: str, base_dir: Path, source: str, patterns: Sequence[str], exclude: Sequence[str]
) -> Dataset:
    """Find, parse, select and digest one dataset entry: `name@version` listed in the registry
    (fetched into the cache), else `name`, `name@digest` or a path."""
    pin = PIN_PATTERN.match(ref)
    listed = listed_dataset(ref, source, is_pin=pin is not None)
    if listed is not None:
        registry, entry = listed
        pin = None
        path = fetch_dataset(entry, registry.location)
        name = entry.name
    else:
        path = find_dataset(pin.group("name") if pin else ref, base_dir, source)
        name = path.name
    if not is_valid_name(name):
        raise SpecError(f"{path}: {name!r} is not a valid dataset name")
    found = task_dirs(path)
    if not found:
        raise SpecError(f"{path}: no tasks (expected folders holding task.toml)")
    # selection by folder name comes first: a task left out is never parsed, so one HEMRA
    # would refuse cannot stop a run that excludes it
    selected = tuple(load_task(task_dir) for task_dir in select_tasks(found, patterns, exclude))
    digest = tree_digest(path, [t.path for t in selected])
    if pin and not digest.startswith(pin.group("digest")):
        raise SpecError(
            f"{source}: key 'datasets': {ref!r} is pinned to {pin.group('digest')} "
            f"but its selected content has digest {digest}"
        )
    return Dataset(name=name, path=path, digest=digest, tasks=selected)


def task_dirs(dataset_dir: Path) -> list[Path]:
    return sorted(p for p in dataset_dir.iterdir() if p.is_dir() and (p / "task.toml").is_file())


def load_task(path: Path) -> Task:
    """Parse one task folder; anything missing or malformed names the task's file."""
    if not is_valid_name(path.name):
        raise SpecError(f"{path}: {path.name!r} is not a valid task name")
    check_links(path)
    config = parse_model(TaskConfig, read_toml(path / "task.toml"), str(path / "task.toml"), "key")
    found = compose_file(path / "environment")
    compose = None
    if found is not None:
        compose = load_compose(
            found,
            has_dockerfile=(path / "environment" / "Dockerfile").is_file(),
            docker_image=config.environment.docker_image,
        )
    warnings = tuple(
        f"{path / 'task.toml'}: key '{key}' is not one of Harbor's task keys (ignored)"
        for key in unknown_keys(config)
    )
    if config.steps:
        _check_steps(path, config)
        first = path / "steps" / config.steps[0].name / "instruction.md"
        return Task(path.name, path, config, first.read_text(encoding="utf-8"), warnings, compose)
    instruction_file = path / "instruction.md"
    if not instruction_file.is_file():
        raise SpecError(f"{instruction_file}: missing (every task needs its instruction)")
    instruction = instruction_file.read_text(encoding="utf-8")
    if not instruction.strip():
        raise SpecError(f"{instruction_file}: empty (every task needs its instruction)")
    hemra = config.hemra
    if hemra.track == "swe":
        where = f"{path / 'task.toml'}: key 'hemra"
        if not hemra.test_command:
            raise SpecError(f"{where}.test_command' is required for the swe track (an argv list)")
        if not hemra.test_patch:
            raise SpecError(f"{where}.test_patch' is required for the swe track (a patch file)")
        patch = (path / hemra.test_patch).resolve()
        if path.resolve() not in patch.parents or not patch.is_file():
            raise SpecError(f"{where}.test_patch': no file {hemra.test_patch!r} in the task folder")
    elif hemra.track == "open":
        if not hemra.criteria:
            raise SpecError(
                f"{path / 'task.toml'}: key 'hemra.criteria' is required for the open track"
                " ([[hemra.criteria]] tables with name, weight, description)"
            )
        names = [c.name for c in hemra.criteria]
        if len(set(names)) != len(names):
            raise SpecError(f"{path / 'task.toml'}: key 'hemra.criteria': two share a name")
    elif not (path / "tests" / "test.sh").is_file():
        raise SpecError(f"{path / 'tests' / 'test.sh'}: missing (every task needs its verifier)")
    return Task(path.name, path, config, instruction, warnings, compose)


def select_tasks(
    task_folders: Iterable[Path], patterns: Sequence[str], exclude: Sequence[str]
) -> list[Path]:
    """The task folders whose name (the task's name) matches a pattern (any, when none is
    given) and no exclusion: what a run or check selects, before any task is read."""

    def matches(name: str, globs: Sequence[str]) -> bool:
        return any(fnmatch.fnmatchcase(name, glob) for glob in globs)

    return [
        folder
        for folder in task_folders
        if (not patterns or matches(folder.name, patterns)) and not matches(folder.name, exclude)
    ]


def check_links(task_dir: Path) -> None:
    """Refuse a task whose folder holds a link (to a file or a folder, dangling or not) that
    resolves outside the task folder: its target is a host file, not the task's."""
    root = task_dir.resolve()
    for folder, dirs, files in os.walk(task_dir):
        for name in [*dirs, *files]:
            entry = Path(folder) / name
            if not entry.is_symlink():
                continue
            target = Path(os.path.realpath(entry))
            if target != root and root not in target.parents:
                raise SpecError(
                    f"{entry}: a link to {target}, outside the task folder {root}"
                    " (a task's files must be inside its folder)"
                )


def tree_digest(root: Path, folders: Sequence[Path]) -> str:
    """sha256 over `relative/path\\0sha256(content)` lines, sorted, for every file in `folders`;
    a link counts as `link:` and where it points (never followed)."""
    lines = []
    for folder in folders:
        for file in folder.rglob("*"):
            relative = file.relative_to(root)
            if IGNORED_PARTS.intersection(relative.parts):
                continue
            if file.is_symlink():
                content = "link:" + os.readlink(file)
            elif file.is_file():
                content = hashlib.sha256(file.read_bytes()).hexdigest()
            else:
                continue
            lines.append(f"{relative.as_posix()}\0{content}\n")
    return hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()


def _check_steps(path: Path, config: TaskConfig) -> None:
    """Every step has its instruction, and a verifier of its own or the task's."""
    names = [step.name for step in config.steps]
    if len(set(names)) != len(names):
        raise SpecError(f"{path / 'task.toml'}: key 'steps': two steps share a name")
    for step in config.steps:
        folder = path / "steps" / step.name
        instruction = folder / "instruction.md"
        if not instruction.is_file() or not instruction.read_text(encoding="utf-8").strip():
            raise SpecError(f"{instruction}: missing or empty (every step needs its instruction)")
        if (
            not (folder / "tests" / "test.sh").is_file()
            and not (path / "tests" / "test.sh").is_file()
        ):
            raise SpecError(
                f"{folder / 'tests' / 'test.sh'}: missing, and the task has no tests/test.sh"
            )
