"""One store everyone finds: a run started from the repository root is found there by every
command that reads runs, none of them told where (no --store, no HEMRA_STORE)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO
from tests.docs_runner import Reader


@pytest.mark.usefixtures("docker_test")
def test_a_run_from_the_repository_root_is_found_by_runs_report_show_and_view(
    tmp_path: Path,
) -> None:
    """The repository root as a user has it (`examples/oracle-vs-nop.toml` in it, the bundled
    datasets beside), copied so the test's store is its own; two tasks of the run file's two
    datasets keep it short."""
    root = tmp_path / "repository"
    (root / "examples").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "oracle-vs-nop.toml", root / "examples")
    env = {k: v for k, v in os.environ.items() if k != "HEMRA_STORE"}

    def hemra(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["hemra", *argv], cwd=root, env=env, capture_output=True, text=True, timeout=600
        )

    ran = hemra(
        "run", "examples/oracle-vs-nop.toml", "-t", "create-file", "-t", "dedupe-lines",
        "--", "--junitxml=junit.xml",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    store = root / ".hemra" / "hemra.db"
    assert store.is_file() and not (root / "examples" / ".hemra").exists()
    announced = re.search(r"HEMRA run (\S+) \(oracle-vs-nop\) - store (\S+)", ran.stdout)
    assert announced is not None and announced.group(2) == str(store)
    run_id = announced.group(1)

    listed = hemra("runs")
    assert listed.returncode == 0 and run_id in listed.stdout and "4/4" in listed.stdout
    report = hemra("report")
    assert report.returncode == 0 and f"HEMRA run {run_id}" in report.stdout
    assert "oracle" in report.stdout and "nop (baseline)" in report.stdout
    shown = hemra("show", f"{run_id}.00000")
    assert shown.returncode == 0 and shown.stdout.startswith(f"trial {run_id}.00000: ")
    viewed = Reader(root, env).run("```bash runnable\nhemra view   # until Ctrl-C\n```\n")
    assert "after Ctrl-C" in viewed[-1]

    # the JUnit file's properties are the ones docs/sandbox.md lists
    cases = list(ET.parse(root / "junit.xml").getroot().iter("testcase"))
    assert len(cases) == 4
    names = {p.get("name") for case in cases for p in case.iter("property")}
    sandbox_md = (REPO / "docs" / "sandbox.md").read_text()
    listed_in_docs = sandbox_md.split("testcase per trial with 11 properties:", 1)[1].split(")")[0]
    assert names == set(re.findall(r"`([a-z_]+)`", listed_in_docs)) and len(names) == 11

    # from another folder, HEMRA_STORE points every command at this store
    other = tmp_path / "elsewhere"
    other.mkdir()
    found = subprocess.run(
        ["hemra", "runs", "-q"], cwd=other, env={**env, "HEMRA_STORE": str(store)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert found.stdout.split() == [run_id]


def test_init_example_writes_a_bundled_example_as_the_checkout_has_it_and_overwrites_nothing(
    tmp_path: Path,
) -> None:
    """`hemra init --example NAME` is how a pip user gets what the docs run from a clone's
    examples/: the same files at the same paths under ./examples/, so the same commands run."""

    def hemra(*argv: str, columns: str = "") -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "HEMRA_STORE")}
        return subprocess.run(
            ["hemra", *argv], cwd=tmp_path, env=env | ({"COLUMNS": columns} if columns else {}),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    listed = hemra("init", "--example", columns="80")  # one line an example, fitting
    assert listed.returncode == 0, listed.stderr
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80, listed.stdout
    names = [line.split()[0] for line in listed.stdout.splitlines()[:-1]]
    checkout = sorted(p.stem for p in (REPO / "examples").iterdir() if p.suffix in ("", ".toml"))
    assert sorted(names) == checkout and "oracle-vs-nop" in names

    written = hemra("init", "--example", "oracle-vs-nop")
    assert written.returncode == 0, written.stderr
    assert written.stdout.splitlines() == [
        "wrote examples/oracle-vs-nop.toml",
        "next: hemra run examples/oracle-vs-nop.toml --dry-run   (its comments say what it needs)",
    ]
    copied = tmp_path / "examples" / "oracle-vs-nop.toml"
    assert copied.read_bytes() == (REPO / "examples" / "oracle-vs-nop.toml").read_bytes()
    planned = hemra("run", "examples/oracle-vs-nop.toml", "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert "trials: " in planned.stdout and not (tmp_path / ".hemra").exists()

    folder = hemra("init", "--example", "restart-drill")
    assert folder.returncode == 0, folder.stderr
    drill = tmp_path / "examples" / "restart-drill" / "drill.sh"
    assert drill.read_bytes() == (REPO / "examples" / "restart-drill" / "drill.sh").read_bytes()
    assert drill.stat().st_mode & 0o111

    again = hemra("init", "--example", "oracle-vs-nop")
    assert again.returncode == 4
    assert (
        "examples/oracle-vs-nop.toml: already exists; hemra init overwrites nothing" in again.stderr
    )
    unknown = hemra("init", "--example", "oracle-vs-np")
    assert unknown.returncode == 4 and not unknown.stdout
    assert "no bundled example named 'oracle-vs-np' (did you mean 'oracle-vs-nop'?" in (
        unknown.stderr
    )
