"""HEMRA's start of pytest for the SWE track: `python -m pytest ARGS` as the task wrote it, run as
`python THIS_FILE ARGS`. Python puts this file's folder (HEMRA's, root's) first on sys.path, not the
working folder, so pytest, every module of `_pytest`, what they import (pluggy, iniconfig, attrs,
the standard library...) and the installed pytest plugins are loaded from the installed
distributions first; only then does the working folder go first on sys.path, as `python -m pytest`
has it, for the project and its tests. A module of the agent's named like one of those is never
imported: the loaded one is."""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import sys

import _pytest
import pytest

# what pytest imports only when a feature asks for it, loaded now all the same
LATER = (
    "doctest", "pdb", "bdb", "json", "xml.etree.ElementTree", "tempfile", "shutil", "subprocess",
    "difflib", "pprint", "decimal", "fractions", "faulthandler", "tracemalloc", "unittest",
    "unittest.mock", "importlib.metadata", "importlib.util", "logging", "warnings", "glob",
)  # fmt: skip


def _load(name: str) -> None:
    with contextlib.suppress(Exception):  # one that does not load here is not pytest's loss
        importlib.import_module(name)


def _entry_point_modules() -> list[str]:
    """The modules of the installed pytest plugins (`pytest11` entry points)."""
    try:
        from importlib import metadata

        found = metadata.entry_points()
        points = (
            found.select(group="pytest11") if hasattr(found, "select")
            else found.get("pytest11", ())
        )  # fmt: skip
        return [point.value.split(":")[0] for point in points]
    except Exception:
        return []


def main() -> int:
    with contextlib.suppress(Exception):  # a package that fails to load ends the walk alone
        for info in pkgutil.walk_packages(_pytest.__path__, "_pytest.", onerror=lambda _: None):
            _load(info.name)
    for name in (*LATER, *_entry_point_modules()):
        _load(name)
    sys.path.insert(0, os.getcwd())  # as `python -m pytest` has it, for the project alone
    start = getattr(pytest, "console_main", None) or pytest.main
    return int(start())


if __name__ == "__main__":
    sys.exit(main())
