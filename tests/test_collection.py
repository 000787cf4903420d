"""Collection: one item per harness x dataset x task x attempt, deterministic, -k selectable."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TaskMaker


@pytest.fixture
def run_file(tmp_path: Path, make_task: TaskMaker) -> Path:
    make_task("beta")
    make_task("alpha")
    make_task("gamma", dataset="other")
    path = tmp_path / "run.toml"
    path.write_text('harnesses = ["oracle", "nop"]\ndatasets = ["ds", "other"]\nattempts = 2\n')
    return path


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest("--collect-only", "-q", *args)
    assert result.ret == 0, result.outlines
    return [line for line in result.outlines if "::" in line]


def test_every_trial_is_an_item_in_a_stable_order(
    pytester: pytest.Pytester, run_file: Path
) -> None:
    items = collected(pytester, "--hemra-run", str(run_file))
    assert items == [
        "ds::alpha[oracle-1]",
        "ds::alpha[oracle-2]",
        "ds::alpha[nop-1]",
        "ds::alpha[nop-2]",
        "ds::beta[oracle-1]",
        "ds::beta[oracle-2]",
        "ds::beta[nop-1]",
        "ds::beta[nop-2]",
        "other::gamma[oracle-1]",
        "other::gamma[oracle-2]",
        "other::gamma[nop-1]",
        "other::gamma[nop-2]",
    ]
    assert collected(pytester, "--hemra-run", str(run_file)) == items


def test_k_selects_by_harness_dataset_and_task(pytester: pytest.Pytester, run_file: Path) -> None:
    run = ("--hemra-run", str(run_file))
    assert collected(pytester, *run, "-k", "nop and alpha") == [
        "ds::alpha[nop-1]",
        "ds::alpha[nop-2]",
    ]
    assert collected(pytester, *run, "-k", "other and oracle") == [
        "other::gamma[oracle-1]",
        "other::gamma[oracle-2]",
    ]
    assert collected(pytester, *run, "-k", "beta[oracle-2]") == ["ds::beta[oracle-2]"]


def test_collect_only_records_nothing(
    pytester: pytest.Pytester, run_file: Path, tmp_path: Path
) -> None:
    collected(pytester, "--hemra-run", str(run_file))
    assert not (pytester.path / ".hemra").exists()


def test_tasks_and_exclude_select_by_glob(pytester: pytest.Pytester, run_file: Path) -> None:
    items = collected(
        pytester,
        "--hemra-run",
        str(run_file),
        "--hemra-task",
        "*a",
        "--hemra-exclude",
        "gam*",
        "--hemra-harness",
        "nop",
        "--hemra-attempts",
        "1",
    )
    assert items == ["ds::alpha[nop-1]", "ds::beta[nop-1]"]


def test_without_hemra_options_the_plugin_stays_out_of_the_way(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_plain():\n    assert True\n")
    pytester.runpytest().assert_outcomes(passed=1)
