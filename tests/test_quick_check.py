"""The README's quick check, `tox -e example`, needs Docker and Python alone: none of the full
suite's prerequisites (chromium for the viewer tests, PostgreSQL for the shared store)."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

# what the suite needs and the quick check must not: chromium, PostgreSQL's programs
SUITE_ONLY = re.compile(r"chrom|^initdb$|^psql$|^postgres$|^pg_")


def path_without_suite_tools(folder: Path) -> str:
    """This PATH with the suite's programs taken out: each folder holding one is replaced, in
    place, by a folder of links to its other programs (a folder without any, a virtualenv's
    among them, stays itself: a link to a virtualenv's python would lose the virtualenv)."""
    entries = []
    for index, directory in enumerate(os.environ["PATH"].split(os.pathsep)):
        programs = sorted(Path(directory).iterdir()) if Path(directory).is_dir() else []
        if not any(SUITE_ONLY.search(program.name) for program in programs):
            entries.append(directory)
            continue
        links = folder / str(index)
        links.mkdir(parents=True)
        for program in programs:
            if not SUITE_ONLY.search(program.name) and program.is_file():
                (links / program.name).symlink_to(program)
        entries.append(str(links))
    return os.pathsep.join(entries)


def example_commands(*posargs: str) -> list[str]:
    """What `tox -e example -- POSARGS` runs, in order, as tox itself reads tox.ini."""
    shown = subprocess.run(
        ["tox", "config", "-e", "example", "-k", "commands_pre", "commands", "--", *posargs],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    config = configparser.ConfigParser(interpolation=None)
    config.read_string(shown.stdout)
    env = config["testenv:example"]
    return [line for key in ("commands_pre", "commands") for line in env[key].splitlines() if line]


@pytest.mark.usefixtures("docker_client")
def test_the_quick_check_runs_with_chromium_and_postgresql_absent_from_path(
    tmp_path: Path,
) -> None:
    """Its commands, as tox would run them (from the repository root; `--dry-run` appended, so
    the check is of what it needs, not of the trials), with a PATH where neither is found."""
    path = path_without_suite_tools(tmp_path / "bin")
    for program in ("chromium", "initdb", "psql"):
        assert shutil.which(program, path=path) is None
    assert shutil.which("docker", path=path) and shutil.which("hemra", path=path)
    commands = example_commands("--dry-run")
    assert commands[-1] == "hemra run examples/oracle-vs-nop.toml --dry-run", commands
    env = {k: v for k, v in os.environ.items() if k != "HEMRA_STORE"} | {"PATH": path}
    for command in commands:
        ran = subprocess.run(
            shlex.split(command), cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        assert ran.returncode == 0, f"{command}: {ran.stdout[-2000:]}{ran.stderr[-2000:]}"
    assert "trials: " in ran.stdout and not (REPO / "examples" / ".hemra").exists()
