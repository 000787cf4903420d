"""Every command a docs page marks runnable is run, in order, as a reader would, and exits as the
page says (tests/docs_runner.py has the marks). Offline: the commands use the bundled oracle and
nop, dry runs, and the scripted model. The README's are run by test_wheel.py, from the wheel.

Each page gets a folder of its own, as the repository root looks to a reader (`examples/` in it,
linked: the pages' commands only read it), so its store and files are its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import REPO
from tests.docs_runner import Reader, steps

RUNNABLE = sorted(
    page
    for page in (REPO / "docs").glob("*.md")
    if any(not hasattr(step, "text") for step in steps(page.read_text()))
)


def test_the_pages_a_reader_acts_on_mark_their_commands_runnable() -> None:
    assert {p.name for p in RUNNABLE} >= {
        "write-a-harness.md",
        "write-a-dataset.md",
        "ci.md",
        "harbor.md",
    }


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: p.name)
def test_a_docs_pages_runnable_commands_exit_as_it_says(page: Path, tmp_path: Path) -> None:
    folder = tmp_path / "repository"
    folder.mkdir()
    (folder / "examples").symlink_to(REPO / "examples")
    env = {k: v for k, v in os.environ.items() if k != "HEMRA_STORE"}
    done = Reader(folder, env).run(page.read_text())
    assert done, page
