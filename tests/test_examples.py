"""The examples in examples/ run as their comments say."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO


@pytest.mark.usefixtures("docker_test")
def test_own_harness_example_passes_with_its_harness_and_fails_with_nop(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    result = pytester.runpytest(
        "--hemra-run",
        str(REPO / "examples" / "own-harness" / "run.toml"),
        "--hemra-store",
        str(tmp_path / "s.db"),
    )
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["nop (baseline)*2/2*0*", "echo-agent*2/2*2*1*1*"])


def test_examples_collect(pytester: pytest.Pytester) -> None:
    run_files = sorted((REPO / "examples").glob("*.toml")) + sorted(
        (REPO / "examples").glob("*/run.toml")
    )
    assert len(run_files) >= 2
    for run_file in run_files:
        result = pytester.runpytest("--hemra-run", str(run_file), "--collect-only", "-q")
        assert result.ret == 0, (run_file, result.errlines)
