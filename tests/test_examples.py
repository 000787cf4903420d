"""The examples in examples/ run as their comments say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO
from pytest_hemra.execute.gateway.scripted import SCRIPTED_USAGE
from pytest_hemra.store import Store


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


@pytest.mark.slow
def test_examples_collect(tmp_path: Path) -> None:
    """Every example's run file resolves, each in a process of its own started in the
    example's folder, as their comments say to run them (a pytest where a conftest.py adds to
    HEMRA, else `hemra run --dry-run`); three at a time."""
    run_files = sorted((REPO / "examples").glob("*.toml")) + sorted(
        (REPO / "examples").glob("*/run.toml")
    )
    assert len(run_files) >= 2
    env = {  # examples of real models need keys to resolve; collecting calls none
        **os.environ,
        **dict.fromkeys(("ANTHROPIC_API_KEY", "OPENAI_API_KEY"), "sk-sentinel-collect-only"),
        "HEMRA_STORE": str(tmp_path / "hemra.db"),
    }

    def collect(run_file: Path) -> subprocess.CompletedProcess[str]:
        """A pytest collecting the run where a conftest.py adds to HEMRA (its harness kinds,
        providers); elsewhere `hemra run --dry-run`, which resolves the same plan in a third of
        the time."""
        if (run_file.parent / "conftest.py").exists():
            argv = [sys.executable, "-m", "pytest", "--hemra-run", str(run_file)]
            argv += ["--collect-only", "-q", "-p", "no:cacheprovider"]
        else:
            argv = ["hemra", "run", str(run_file), "--dry-run"]
        return subprocess.run(
            argv, cwd=run_file.parent, env=env, capture_output=True, text=True, timeout=300
        )

    with ThreadPoolExecutor(3) as pool:
        for run_file, result in zip(run_files, pool.map(collect, run_files), strict=True):
            assert result.returncode == 0, (run_file, result.stdout[-2000:], result.stderr)
            assert " collected" in result.stdout or "trials: " in result.stdout, run_file


@pytest.mark.usefixtures("docker_test")
def test_scripted_agent_example_solves_tasks_through_the_gateway_counted_to_the_token(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    store_path = tmp_path / "s.db"
    result = pytester.runpytest(
        "--hemra-run",
        str(REPO / "examples" / "scripted-agent" / "run.toml"),
        "--hemra-store",
        str(store_path),
    )
    result.assert_outcomes(passed=4, failed=4)
    store = Store(store_path)
    (run,) = store.runs()
    calls = store.calls(run_id=run.id)
    assert len(calls) == 8  # per task: the bash tool call, then the final message
    for call in calls:
        assert (call.status, call.provider, call.model) == (200, "scripted", "hemra/scripted")
        assert (call.input_tokens, call.output_tokens) == (
            SCRIPTED_USAGE.input_tokens,
            SCRIPTED_USAGE.output_tokens,
        )
        assert (call.cache_read_tokens, call.cache_write_tokens) == (
            SCRIPTED_USAGE.cache_read_tokens,
            SCRIPTED_USAGE.cache_write_tokens,
        )
    for trial in store.trials(run.id):
        if "mini-agent" in trial.item_id:  # each call's bodies are kept in the trial folder
            calls = Path(trial.trial_dir or "") / "calls"
            first = json.loads((calls / "0001.request.json").read_text())
            assert first["model"] == "hemra/scripted" and first["messages"][0]["role"] == "user"
            assert '"tool_use"' in (calls / "0001.response").read_text()
            assert (calls / "0002.response").is_file() and not (calls / "0003.response").exists()
    per_trial = {t.item_id: t.tokens for t in store.trials(run.id)}
    for item, tokens in per_trial.items():
        assert tokens == (2 * SCRIPTED_USAGE.total_tokens if "mini-agent" in item else 0), item


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_sdk_agent_example_solves_both_datasets_from_the_host(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    result = pytester.runpytest(
        "--hemra-run",
        str(REPO / "examples" / "sdk-agent" / "run.toml"),
        "--hemra-store",
        str(tmp_path / "s.db"),
    )
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(["host-agent (baseline)*6/6*6*1*2160*"])
