"""The sdk harness kind: a host-side Python function acting on a real sandbox."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import TaskMaker
from pytest_hemra.store import Store

pytestmark = pytest.mark.usefixtures("docker_test")


def run_sdk(
    pytester: pytest.Pytester,
    tmp_path: Path,
    write_harness: Callable[..., Path],
    code: str,
    entry: str = "agent.py:solve",
) -> pytest.RunResult:
    write_harness("host", f'kind = "sdk"\nentry = "{entry}"\n')
    (tmp_path / "harnesses" / "agent.py").write_text(textwrap.dedent(code))
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["host"]\ndatasets = ["ds"]\n')
    return pytester.runpytest("--hemra-run", str(run_file))


def only_trial(folder: Path) -> object:
    store = Store(folder / ".hemra" / "hemra.db")
    (run,) = store.runs()
    (trial,) = store.trials(run.id)
    return trial


def test_sdk_function_acts_on_the_sandbox_as_the_agent_user(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    make_task("one")
    result = run_sdk(
        pytester,
        tmp_path,
        write_harness,
        """\
        def solve(agent):
            who = agent.run("id -u").stdout.strip()
            agent.write_file("/app/out.txt", "hi")
            assert agent.read_file("/app/out.txt") == b"hi"
            assert agent.run(["ls", "/tests"]).exit_code != 0  # the verifier's files are hidden
            return f"ran as {who} with {agent.seconds_left:.0f}s left"
    """,
    )
    result.assert_outcomes(passed=1)
    trial = only_trial(pytester.path)
    stdout = (Path(trial.trial_dir) / "agent" / "stdout.txt").read_text()  # type: ignore[attr-defined]
    assert stdout.startswith("ran as 1000 with ")


def test_sdk_function_that_raises_is_a_harness_error_with_its_traceback(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    make_task("one")
    run_sdk(
        pytester,
        tmp_path,
        write_harness,
        """\
        def solve(agent):
            raise RuntimeError("the agent gave up")
    """,
    ).assert_outcomes(failed=1)
    trial = only_trial(pytester.path)
    assert trial.outcome == "harness_error"  # type: ignore[attr-defined]
    stderr = (Path(trial.trial_dir) / "agent" / "stderr.txt").read_text()  # type: ignore[attr-defined]
    assert "RuntimeError: the agent gave up" in stderr


def test_sdk_function_past_the_deadline_is_a_timeout(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    make_task("slow", task_toml="[agent]\ntimeout_sec = 2\n")
    run_sdk(
        pytester,
        tmp_path,
        write_harness,
        """\
        def solve(agent):
            agent.run("echo hi > /app/out.txt")
            agent.run("sleep 30")
    """,
    ).assert_outcomes(failed=1)
    trial = only_trial(pytester.path)
    assert (trial.outcome, trial.reward) == ("timeout", 1.0)  # type: ignore[attr-defined]


def test_sdk_entry_that_cannot_load_refuses_the_run(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    make_task("one")
    result = run_sdk(pytester, tmp_path, write_harness, "def other(agent):\n    pass\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *host.toml: key 'entry': cannot load agent.py:solve*"])
    assert not (pytester.path / ".hemra").exists()
