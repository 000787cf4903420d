"""Harness kinds are plug-ins: a conftest.py adds one through `pytest_hemra_harness_kinds`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import TaskMaker
from pytest_hemra.store import Store

KINDS = '''
import pytest

from pytest_hemra.core.errors import SpecError
from pytest_hemra.execute.kinds import SandboxKind
from pytest_hemra.execute.sandbox import AGENT_USER


class Writer(SandboxKind):
    """Writes what the harness file's description says into /app/out.txt, in the sandbox."""

    calls_models = False
    needs_command = False

    def validate(self, path, spec):
        super().validate(path, spec)
        if not spec.description:
            raise SpecError(f"{path}: key 'description' says what a writer harness writes")

    def run_agent(self, turn):
        text = turn.harness.spec.description
        return turn.sandbox.exec(
            ["sh", "-c", 'printf %s "$1" > /app/out.txt', "writer", text],
            user=AGENT_USER,
            env=turn.env,
            timeout=30,
            stdout=turn.stdout,
            stderr=turn.stderr,
        )


@pytest.hookimpl
def pytest_hemra_harness_kinds():
    return {"writer": Writer()}
'''


@pytest.fixture
def writers(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> Path:
    """A conftest.py registering kind `writer`, two writer harnesses and a run of both."""
    pytester.makeconftest(KINDS)
    make_task("hello")
    write_harness("writes-hi", 'kind = "writer"\ndescription = "hi"\n')
    write_harness("writes-bye", 'kind = "writer"\ndescription = "bye"\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["writes-hi", "writes-bye"]\ndatasets = ["ds"]\n')
    return run_file


@pytest.mark.usefixtures("docker_test")
def test_a_kind_registered_from_a_conftest_runs_its_trials_in_the_sandbox(
    pytester: pytest.Pytester, tmp_path: Path, writers: Path
) -> None:
    result = pytester.runpytest("--hemra-run", str(writers))
    result.assert_outcomes(passed=1, failed=1)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    outcomes = {t.harness: (t.outcome, t.reward) for t in store.trials(run.id)}
    assert outcomes == {"writes-hi": ("pass", 1.0), "writes-bye": ("fail", 0.0)}
    recorded = store.run(run.id).spec["harnesses"]["writes-hi"]
    assert (recorded["spec"]["kind"], recorded["metered"]) == ("writer", True)
    (trial,) = [t for t in store.trials(run.id) if t.harness == "writes-bye"]
    folder = Path(trial.trial_dir or "")
    assert "+bye" in (folder / "diff.patch").read_text()
    assert json.loads((folder / "result.json").read_text())["outcome"] == "fail"


@pytest.mark.parametrize(
    ("harness", "expected"),
    [
        ('kind = "writer"\n', "*writes-hi.toml: key 'description' says what a writer*"),
        (
            'kind = "scribe"\n',
            "*writes-hi.toml: key 'kind': input should be 'program', 'cli', 'sdk', 'acp',"
            " 'harbor' or 'writer', got 'scribe'",
        ),
    ],
)
def test_a_plug_in_kind_checks_its_harness_files_and_is_named_among_the_kinds(
    pytester: pytest.Pytester,
    tmp_path: Path,
    writers: Path,
    write_harness: Callable[..., Path],
    harness: str,
    expected: str,
) -> None:
    write_harness("writes-hi", harness)
    result = pytester.runpytest("--hemra-run", str(writers))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {expected}"])
    assert not (pytester.path / ".hemra").exists()
