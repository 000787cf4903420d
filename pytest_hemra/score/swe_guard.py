"""What of /app the SWE track treats as the task's test infrastructure: put back as the task
shipped it for the hidden run, and tampering when the agent changed it (`guard`); and which
pytest configuration file the task shipped (`shipped_config`)."""

from __future__ import annotations

import configparser
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

# pytest's configuration files, in the order it picks one (pytest 9's .toml names first); the
# first four steer the tests whole, the others by their pytest section
CONFIG_FILES = (
    "pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
    "setup.cfg",
)  # fmt: skip
# files that steer test collection or outcomes, wherever they are: put back as shipped
STEERING_NAMES = frozenset(
    {"conftest.py", "sitecustomize.py", "usercustomize.py", *CONFIG_FILES[:4]}
)
STEERING_SECTIONS = {  # config files whose pytest part alone steers the tests
    "pyproject.toml": ("tool", "pytest"),
    "setup.cfg": ("tool:pytest",),
    "tox.ini": ("pytest",),
}
# modules at the top of /app (first on sys.path) that would stand in for the test runner; any
# other the agent adds there named like an installed module is tampering too (`installed_modules`)
RUNNER_MODULES = ("pytest", "_pytest", "py", "pluggy", "unittest", "iniconfig")
TEST_FILE = re.compile(r"^(test.*|.*_test)\.py$")
# caches Python and pytest write when the agent runs the tests: never tampering, and removed
# from the hidden run's copy (a cached module could stand in for its source)
CACHES = frozenset({"__pycache__", ".pytest_cache"})


@dataclass(frozen=True)
class Guard:
    """What the hidden run puts back as the task shipped it, and what the agent touched."""

    originals: dict[str, bytes]  # /app-relative path: content before the agent, restored
    removed: tuple[str, ...]  # paths removed before the originals go back (and test files the
    # agent added: not run, so nothing they do at import reaches the test run)
    tampered: tuple[str, ...]  # what the agent changed that steers the tests: "path: why" each
    uncounted: frozenset[str]  # files the agent added: their tests do not count


def guard(
    before: Mapping[str, bytes],
    after: Mapping[str, bytes],
    hidden_patch: str,
    installed: frozenset[str] = frozenset(),
) -> Guard:
    """Compare /app before and after the agent (regular files, as read by the runner).

    Test infrastructure is the task's: what steers pytest (configuration under any name it reads,
    `conftest.py`, `.pth`, `sitecustomize`, plugin entry points), the tests folders
    (`tests_folders`: an `__init__.py` or helper the agent adds or changes there, or an
    `__init__.py` above them), and the top-level modules of /app (a new one named like a module of
    the installed distributions, `installed`, would stand in for it). A change to any of these is
    tampering, and is put back as shipped; test files the agent adds or changes are left out or
    put back, not tampering (unless the hidden patch writes them), and so are empty files it adds
    in a tests folder (an empty `__init__.py`)."""
    touched = set(_patched_files(hidden_patch))
    folders = tests_folders(before, touched)
    above = {str(parent) for folder in folders for parent in PurePosixPath(folder).parents}
    shipped_tops = {_top_module(path) for path in before}
    originals: dict[str, bytes] = {}
    removed: set[str] = set(touched)
    tampered: list[str] = []
    for path in sorted(set(before) | set(after)):
        if not _is_safe(path) or CACHES.intersection(path.split("/")):
            continue
        name = PurePosixPath(path).name
        parent = str(PurePosixPath(path).parent)
        was, now = before.get(path), after.get(path)
        changed = was != now
        in_tests = any(path.startswith(f"{folder}/") for folder in folders)
        top = _top_module(path)
        if _is_steering(path) or (name == "entry_points.txt" and b"pytest11" in (now or b"")):
            if changed:
                tampered.append(f"{path}: {_verb(was, now)}, and it steers the tests")
                removed.add(path)
        elif name in STEERING_SECTIONS and _pytest_section(name, was) != _pytest_section(name, now):
            tampered.append(f"{path}: its pytest settings {_verb(was, now)}")
            removed.add(path)
        elif path in touched and was is not None and changed:
            tampered.append(f"{path}: {_verb(was, now)}, and the hidden tests patch it")
        elif in_tests and changed and not TEST_FILE.match(name):
            if was is not None or (now or b"").strip():  # an empty file added: removed alone
                tampered.append(f"{path}: {_verb(was, now)} in the tests folder {parent}")
            removed.add(path)
        elif name == "__init__.py" and parent in above and changed:
            if was is not None or (now or b"").strip():
                tampered.append(f"{path}: {_verb(was, now)} above the tests folder")
            removed.add(path)
        elif was is None and top in installed and top not in shipped_tops and not in_tests:
            tampered.append(f"{path}: added, named like the installed module {top}")
            removed.add(path.split("/")[0])
        keep = _is_steering(path) or name == "entry_points.txt" or TEST_FILE.match(name)
        if was is not None and (keep or path in removed) and (was or changed):
            originals[path] = was  # a file over the read cap reads as empty: left as it is
    uncounted = frozenset(p for p in after if p not in before and p not in touched)
    removed |= {p for p in uncounted if _is_safe(p) and TEST_FILE.match(PurePosixPath(p).name)}
    return Guard(originals, tuple(sorted(removed)), tuple(tampered), uncounted)


def tests_folders(before: Mapping[str, bytes], touched: set[str]) -> set[str]:
    """The folders below the top of /app that hold the hidden tests and nothing but tests: a
    folder a test file the hidden patch writes is in, named like one (`tests`, `test_x`,
    `testing`) or whose shipped Python files are all tests, `conftest.py` or `__init__.py`. A
    folder that also holds the project's code is not one (the agent's fix goes there)."""
    found = set()
    for path in touched:
        folder = PurePosixPath(path).parent
        if folder == PurePosixPath(".") or not TEST_FILE.match(PurePosixPath(path).name):
            continue
        shipped = [
            PurePosixPath(other).name
            for other in before
            if PurePosixPath(other).parent == folder and other.endswith(".py")
        ]
        only_tests = all(
            TEST_FILE.match(name) or name in ("conftest.py", "__init__.py") for name in shipped
        )
        if folder.name.startswith("test") or only_tests:
            found.add(str(folder))
    return found


def shipped_config(before: Mapping[str, bytes]) -> str | None:
    """The configuration file pytest reads in /app as the task shipped it (pytest's own order;
    pyproject.toml, tox.ini and setup.cfg only with a pytest section), None for none."""
    for name in CONFIG_FILES:
        content = before.get(name)
        if content is None:
            continue
        if name not in STEERING_SECTIONS or _pytest_section(name, content):
            return name
    return None


def _patched_files(patch: str) -> list[str]:
    """The /app-relative files a -p1 patch writes."""
    files = []
    for line in patch.splitlines():
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            parts = line[4:].split("\t")[0].strip().split("/")[1:]
            if parts and ".." not in parts:
                files.append("/".join(parts))
    return files


def _is_safe(path: str) -> bool:
    return bool(path) and not path.startswith("/") and ".." not in path.split("/")


def _is_steering(path: str) -> bool:
    parts = PurePosixPath(path).parts
    name = parts[-1]
    if name in STEERING_NAMES or name.endswith(".pth"):
        return True
    top = parts[0].removesuffix(".py")
    return top in RUNNER_MODULES and (len(parts) > 1 or name.endswith(".py"))


def _pytest_section(name: str, content: bytes | None) -> object:
    """The part of a config file pytest reads (its text when it does not parse)."""
    if content is None:
        return None
    text = content.decode(errors="replace")
    if name == "pyproject.toml":
        try:
            return tomllib.loads(text).get("tool", {}).get("pytest")
        except tomllib.TOMLDecodeError:
            return text
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return text
    return {
        section: dict(parser.items(section))
        for section in STEERING_SECTIONS[name]
        if parser.has_section(section)
    }


def _top_module(path: str) -> str:
    """The name of the module a path at the top of /app makes importable ("" for none)."""
    parts = PurePosixPath(path).parts
    if len(parts) > 1:
        return parts[0]
    stem, _, suffix = parts[0].partition(".")
    return stem if suffix.rsplit(".", 1)[-1] in ("py", "pyc", "so", "pyd") else ""


def _verb(was: bytes | None, now: bytes | None) -> str:
    return "added" if was is None else "removed" if now is None else "changed"
