"""`hemra run`'s output, shaped for people: a line per trial and the tables, never pytest's
FAILURES section or "1 failed, 1 passed" for a trial that merely failed its task; pytest's own
flags (`-k`, `-n`, `--junitxml`, `-v`) where people type them, any other refused saying what to
type; and every refusal one `hemra: ...` line, exit 4."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import pytest_hemra
from conftest import REPO
from pytest_hemra.cli import installed_version

RUN_FILE = """\
name = "oracle-vs-nop"
harnesses = ["oracle", "nop"]
baseline = "nop"
datasets = ["hemra-offline"]
tasks = ["create-file"]
"""


def hemra(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HEMRA_STORE", "PYTEST_ADDOPTS")}
    return subprocess.run(
        ["hemra", *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "run.toml").write_text(RUN_FILE)
    return tmp_path


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_hemra_run_prints_a_line_per_trial_and_the_table_not_pytests_failures(
    folder: Path,
) -> None:
    ran = hemra(folder, "run", "run.toml")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout
    for pytests in ("FAILURES", "FAILED", "passed", "failed in", "test session starts"):
        assert pytests not in out, out
    assert "Warning" not in out + ran.stderr
    lines = out.splitlines()
    assert re.search(
        r"^\[\d/2\]\s+pass\s+hemra-offline::create-file\s+oracle\s+attempt 1", out, re.M
    )
    assert any(re.match(r"\[\d/2\]\s+fail\s+.*\bnop\s+attempt 1\s+reward 0", x) for x in lines)
    assert re.search(r"^HEMRA run \S+ \(oracle-vs-nop\)", out, re.M)
    assert re.search(r"^oracle\s+1/1\s+1\s+1\.000", out, re.M)  # the table's row


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_k_selects_trials_and_n_2_with_junitxml_writes_one_testcase_a_trial(
    folder: Path,
) -> None:
    ran = hemra(folder, "run", "run.toml", "-k", "oracle", "-n", "2", "--junitxml", "out.xml")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"^\[1/1\]\s+pass\s+.*oracle", ran.stdout, re.M), ran.stdout
    assert " nop " not in ran.stdout.split("HEMRA run")[0]
    cases = list(ET.parse(folder / "out.xml").getroot().iter("testcase"))
    assert [case.get("name") for case in cases] == ["create-file[oracle-1]"]


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_v_keeps_pytests_own_output(folder: Path) -> None:
    ran = hemra(folder, "run", "run.toml", "-v")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "test session starts" in ran.stdout and "1 failed, 1 passed" in ran.stdout


def test_an_unknown_flag_is_refused_saying_to_put_it_after_the_double_dash(
    folder: Path,
) -> None:
    ran = hemra(folder, "run", "run.toml", "--maxfail=1")
    assert ran.returncode == 4 and ran.stdout == ""
    assert ran.stderr == (
        "hemra: hemra run: unknown flag --maxfail=1; put pytest's flags after --:"
        " hemra run run.toml -- --maxfail=1\n"
    )
    assert not (folder / ".hemra").exists()


def test_attempts_are_attempts_and_k_is_not_in_hemra_check(folder: Path) -> None:
    checked = hemra(folder, "check", "hemra-offline", "-k", "2")
    assert checked.returncode == 4
    assert (
        checked.stderr == "hemra: hemra check: unknown flag -k (attempts per task: --attempts N)\n"
    )


@pytest.mark.parametrize(
    ("run_file", "message"),
    [
        ('harnesses = ["oracle"]\ndatasets = ["hemra-offline"]\nattemps = 2\n', "key 'attemps'"),
        ('harnesses = ["oraclee"]\ndatasets = ["hemra-offline"]\n', "no harness named 'oraclee'"),
        (  # refused by the pytest session, which alone resolves the whole run
            'harnesses = ["oracle"]\ndatasets = ["hemra-offline"]\n'
            'verifier = { env = ["HEMRA_TEST_UNSET"] }\n',
            "environment variable HEMRA_TEST_UNSET is not set",
        ),
    ],
    ids=["mistyped key", "unknown harness", "unset variable"],
)
def test_a_refusal_is_one_hemra_line_exit_4_and_nothing_recorded(
    folder: Path, run_file: str, message: str
) -> None:
    (folder / "bad.toml").write_text(run_file)
    ran = hemra(folder, "run", "bad.toml")
    assert ran.returncode == 4 and ran.stdout == ""
    (line,) = ran.stderr.splitlines()
    assert line.startswith("hemra: bad.toml: ") and message in line
    assert not (folder / ".hemra").exists()


def test_version_names_the_installed_distribution(folder: Path) -> None:
    shown = hemra(folder, "--version")
    assert shown.returncode == 0 and shown.stdout == f"hemra {installed_version()}\n"
    assert installed_version() == pytest_hemra.__version__


def test_the_package_is_not_marked_for_assertion_rewriting_once_imported() -> None:
    """`hemra` imports pytest_hemra before its pytest session marks the plugin's package for
    rewriting, which warned "Module already imported so cannot be rewritten" on every `hemra run`
    and `hemra check` from a wheel (an editable install lists no package files, so not here)."""
    from _pytest.assertion.rewrite import AssertionRewriter

    assert AssertionRewriter.is_rewrite_disabled(pytest_hemra.__doc__ or "")


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_warning_about_the_input_is_one_hemra_line_naming_the_file(tmp_path: Path) -> None:
    task = tmp_path / "datasets" / "ds" / "create-file"
    shutil.copytree(REPO / "datasets" / "hemra-offline" / "create-file", task)
    (task / "task.toml").write_text("bogus_key = 1\n" + (task / "task.toml").read_text())
    (tmp_path / "run.toml").write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    ran = hemra(tmp_path, "run", "run.toml")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"hemra: warning: {task / 'task.toml'}: key 'bogus_key'" in ran.stdout.splitlines()[0]
    assert "warnings summary" not in ran.stdout and "controller.py" not in ran.stdout


def test_a_command_line_argparse_refuses_is_one_hemra_line_too(folder: Path) -> None:
    ran = hemra(folder, "run", "run.toml", "--concurrency", "0")
    assert ran.returncode == 4 and ran.stdout == ""
    assert ran.stderr == (
        "hemra: hemra run: argument --concurrency: expected 1 or more, got 0"
        " (see hemra run --help)\n"
    )
