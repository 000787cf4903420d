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
