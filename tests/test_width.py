"""Every table a command prints fits the terminal: columns dropped and named, `--wide` for all,
a pipe without COLUMNS gets every column; flag lines wrap at word boundaries."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pytest_hemra.core.terminal import fit_table, wrap_line
from pytest_hemra.store import Store
from tests import test_reports
from tests.test_reports import record_run, result

unfair = test_reports.unfair  # the store of four harnesses, two attempts each: a wide report


def hemra(*argv: str, columns: int | None) -> list[str]:
    """`hemra ARGV` in a real process, its stdout a pipe, COLUMNS set (or not): its lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    done = subprocess.run(
        ["hemra", *argv], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("columns", [80, 120])
def test_hemra_report_fits_the_terminal_and_names_what_it_left_out(
    unfair: Store, columns: int
) -> None:
    store = str(unfair.path)
    lines = hemra("report", "unfair", "--store", store, columns=columns)
    assert max(len(line) for line in lines) <= columns, "\n".join(lines)
    text = "\n".join(lines)
    assert "mean reward [95% CI]" in text and "vs baseline [95% CI]" in text
    assert f"(left out to fit {columns} columns:" in text and "--wide shows them)" in text
    assert "classes" not in text.split("left out")[0]  # dropped before the headline columns
    flags = [line for line in lines if line.startswith("! ")]
    assert flags and all(len(line) <= columns for line in flags)
    wide = hemra("report", "unfair", "--store", store, "--wide", columns=columns)
    assert max(len(line) for line in wide) > 150 and "left out to fit" not in "\n".join(wide)
    assert hemra("report", "unfair", "--store", store, columns=None) == wide  # a pipe: every column


def test_hemra_runs_and_a_comparison_fit_the_terminal(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    harnesses = [f"agent-with-a-long-name-{n}" for n in range(4)]
    record_run(store, "before", {h: lambda task, attempt: result(1.0) for h in harnesses})
    record_run(store, "after", {h: lambda task, attempt: result(0.0) for h in harnesses})
    runs = hemra("runs", "--store", str(store.path), columns=80)
    assert max(len(line) for line in runs) <= 80
    assert runs[0].split()[:3] == ["run", "name", "status"] and "(left out to fit 80" in runs[-1]
    assert any("harnesses" in line for line in hemra("runs", "--store", str(store.path), "--wide",
                                                     columns=80))  # fmt: skip
    compared = hemra("report", "before", "after", "--store", str(store.path), columns=80)
    assert max(len(line) for line in compared) <= 80, "\n".join(compared)
    assert "REGRESSION" in "\n".join(compared)
    wide = hemra("report", "before", "after", "--store", str(store.path), columns=None)
    header = next(line for line in wide if line.startswith("harness"))
    assert header.split() == ["harness", "before", "after", "change", "[95%", "CI]", "p",
                              "tasks", "verdict"]  # fmt: skip


def test_a_table_keeps_its_important_columns_and_folds_when_one_is_left() -> None:
    headers = ["name", "path", "size", "note"]
    rows = [["a", "/x" * 30, "1", "n" * 20]]
    fitted = fit_table(headers, rows, 40, keep=["name", "size"])
    assert fitted.dropped == ("path", "note") and "size" in fitted.text
    folded = fit_table(["path"], [["word " * 30]], 40)
    assert max(len(line) for line in folded.text.splitlines()) <= 40 and not folded.dropped
    assert fit_table(headers, rows, None).dropped == ()


def test_a_flag_line_wraps_at_word_boundaries_with_a_hanging_indent() -> None:
    line = "! short: " + " ".join(f"word{n:02d}" for n in range(20))
    wrapped = wrap_line(line, 30).splitlines()
    assert all(len(part) <= 30 for part in wrapped) and len(wrapped) > 1
    assert all(part.startswith("  word") for part in wrapped[1:])
    assert " ".join(part.strip() for part in wrapped) == line  # no word cut


def test_hemra_harnesses_fits_the_terminal_and_names_what_it_left_out() -> None:
    repo = str(Path(__file__).parent.parent)
    lines = hemra("harnesses", "--dir", repo, columns=80)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    left_out = " ".join(lines).partition("(left out to fit 80 columns: ")[2]
    assert lines[0].startswith("harness") and "transcript, file;" in left_out
    wide = hemra("harnesses", "--dir", repo, "--wide", columns=80)
    assert wide[0].split()[-1] == "file" and max(len(line) for line in wide) > 80
