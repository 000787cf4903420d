"""`hemra init`: a starter run file, harness and dataset that run as they are."""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

from pytest_hemra.core.errors import HemraError

TEMPLATE = "templates/init"


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
    clashes = [name for name in files if (target / name).exists()]
    if clashes:
        raise HemraError(f"{target / clashes[0]}: already exists; hemra init overwrites nothing")
    written = []
    for name, content in files.items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if path.suffix == ".sh":
            path.chmod(0o755)
        written.append(path)
    return written
