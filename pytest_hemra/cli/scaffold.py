"""`hemra init`: a starter run file, harness and dataset that run as they are, or one of the
bundled examples (`hemra init --example NAME`), written into a folder of the user's."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.names import unknown_name

TEMPLATE = "templates/init"
# what a checkout's examples/ may hold beside the examples themselves (left by running them)
NOT_COPIED = frozenset({"__pycache__", ".hemra", "build", ".pytest_cache"})


@dataclass(frozen=True)
class Example:
    name: str  # what `hemra init --example` takes: a run file's stem, or a folder's name
    path: Path  # the bundled run file or folder
    summary: str  # its first comment line, or its README's title


def starter_files() -> dict[str, bytes]:
    """The starter's files by relative path."""
    root = resources.files("pytest_hemra").joinpath(TEMPLATE)
    found: dict[str, bytes] = {}

    def walk(node: Traversable, prefix: str) -> None:
        for child in node.iterdir():
            name = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, f"{name}/")
            elif child.name != "__pycache__":
                found[name] = child.read_bytes()

    walk(root, "")
    return dict(sorted(found.items()))


def write_starter(target: Path) -> list[Path]:
    """Write the starter into `target`; refuse (writing nothing) if any file already exists."""
    files = starter_files()
    executable = {name for name in files if name.endswith(".sh")}
    return _write_files(target, files, executable)


def bundled_examples() -> dict[str, Example]:
    """The examples HEMRA carries (examples/ of the checkout, or of the wheel) by name."""
    from pytest_hemra.resolve.datasets import bundled_dir

    root = bundled_dir("examples")
    found: dict[str, Example] = {}
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.name in NOT_COPIED or path.name.startswith("."):
            continue
        if path.is_dir():
            found[path.name] = Example(path.name, path, _summary(path))
        elif path.suffix == ".toml":
            found[path.stem] = Example(path.stem, path, _summary(path))
    return found


def write_example(name: str, target: Path) -> list[Path]:
    """Write the bundled example `name` into `target`/examples/, as the checkout has it (so the
    commands its comments give run from `target`); refuse (writing nothing) if any file of it
    already exists there, or if no example has that name."""
    examples = bundled_examples()
    if name not in examples:
        raise HemraError(unknown_name("bundled example", name, examples))
    source = examples[name].path
    sources = (
        {source.name: source}
        if source.is_file()
        else {f"{source.name}/{path.relative_to(source)}": path for path in _files_of(source)}
    )
    files = {f"examples/{relative}": path.read_bytes() for relative, path in sources.items()}
    executable = {
        f"examples/{relative}" for relative, path in sources.items() if _is_executable(path)
    }
    return _write_files(target, files, executable)


def _write_files(target: Path, files: dict[str, bytes], executable: set[str]) -> list[Path]:
    clashes = [name for name in files if (target / name).exists()]
    if clashes:
        raise HemraError(f"{target / clashes[0]}: already exists; hemra init overwrites nothing")
    written = []
    for name, content in files.items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if name in executable:
            path.chmod(0o755)
        written.append(path)
    return written


def _files_of(folder: Path) -> list[Path]:
    found = []
    for path in sorted(folder.iterdir()):
        if path.name in NOT_COPIED or path.suffix == ".pyc":
            continue
        found += _files_of(path) if path.is_dir() else [path]
    return found


def _is_executable(path: Path) -> bool:
    return path.suffix == ".sh" or bool(path.stat().st_mode & 0o100)


def _summary(path: Path) -> str:
    """The first line of what an example says about itself: a run file's first comment; for a
    folder, its README's title, else its run file's first comment, else its script's docstring."""
    candidates = [path / "README.md", path / "run.toml", *sorted(path.glob("*.py"))]
    for candidate in candidates if path.is_dir() else [path]:
        first = candidate.read_text().lstrip().splitlines()[:1] if candidate.is_file() else []
        if first and first[0].startswith(("#", '"""')):
            return first[0].lstrip('#" ').rstrip('" ').strip()
    return ""
