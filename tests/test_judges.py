"""Judges after the verifier: a model judge through the gateway (the scripted model, offline)
and a program judge, scored per trial, counted apart from the harness, shown as columns."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from conftest import TaskMaker
from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.judges import resolve_judges
from pytest_hemra.resolve.spec import JudgeSpec
from pytest_hemra.score.judges import Material, _parse_program_line, _score
from pytest_hemra.store import Store


@pytest.mark.usefixtures("docker_test")
def test_judges_score_each_trial_and_their_calls_are_counted_apart(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("one")
    make_task("two")
    judge_script = tmp_path / "judge.py"
    judge_script.write_text(
        textwrap.dedent(
            """\
            import json, sys
            diff = open(sys.argv[1]).read()
            print(json.dumps({"score": 0.5 if diff else 0.25, "rationale": "by size"}))
            """
        )
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        textwrap.dedent(
            f"""\
            harnesses = ["oracle", "nop"]
            datasets = ["ds"]
            [[judge]]
            name = "correctness"
            model = "hemra/scripted"
            [[judge]]
            name = "size"
            command = ["python3", "{judge_script}", "{{diff_file}}"]
            """
        )
    )
    summary = tmp_path / "summary.json"
    result = pytester.runpytest("--hemra-run", str(run_file), f"--hemra-summary={summary}")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        ["*judge correctness*judge size*", "oracle (baseline)*1.000*0.500*"]
    )

    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    for trial in store.trials(run.id):
        solved = trial.harness == "oracle"
        assert trial.judges == {
            "correctness": 1.0 if solved else 0.0,
            "size": 0.5 if solved else 0.25,
        }
        assert trial.tokens == 0  # a program harness: the judge's tokens are not the harness's
        calls = store.calls(trial=trial.id)
        assert [c.role for c in calls] == ["judge:correctness"]
        judgments = {j["judge"]: j for j in store.judgments(trial.id)}
        assert judgments["correctness"]["calls"] == 1
        assert judgments["correctness"]["input_tokens"] > 0
        assert "SCORE:" in judgments["correctness"]["rationale"]
        assert judgments["size"]["rationale"] == "by size"
    data = json.loads(summary.read_text())
    (dataset,) = data["datasets"]
    rows = {row["harness"]: row for row in dataset["harnesses"]}
    assert rows["oracle"]["judges"]["correctness"]["mean"] == 1.0
    assert rows["nop"]["judges"]["size"]["mean"] == 0.25


def test_a_judge_needs_a_model_or_a_command_and_a_rubric(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"run.toml: key 'judge\[0\]': give a judge a 'model'"):
        resolve_judges([JudgeSpec(name="j")], tmp_path, "run.toml")
    with pytest.raises(SpecError, match=r"key 'judge\[0\]': give a judge 'model' or 'command'"):
        resolve_judges([JudgeSpec(name="j", model="m", command=["x"])], tmp_path, "run.toml")
    (default,) = resolve_judges([JudgeSpec(name="correctness")], tmp_path, "r", "run-model")
    assert default.model == "run-model"  # `--judge correctness` asks the run's model
    with pytest.raises(SpecError, match=r"key 'judge\[0\].rubric': no rubric 'nope'"):
        resolve_judges([JudgeSpec(name="nope", model="m")], tmp_path, "run.toml")
    (tmp_path / "judges").mkdir()
    (tmp_path / "judges" / "mine.md").write_text("Be strict.")
    (judge,) = resolve_judges([JudgeSpec(name="mine", model="m")], tmp_path, "run.toml")
    assert judge.rubric == "Be strict."
    (bundled,) = resolve_judges([JudgeSpec(name="correctness", model="m")], tmp_path, "r")
    assert "correctness" in bundled.rubric


def test_scores_are_read_from_the_last_score_line_and_checked() -> None:
    assert _score("SCORE: 0.2\nthinking again\nSCORE: 0.75") == 0.75
    assert _score("score: 1") == 1.0
    assert _score("SCORE: 7") is None
    assert _score("no verdict") is None
    assert _parse_program_line("p", '{"score": 0.4, "rationale": "ok"}').score == 0.4
    assert _parse_program_line("p", "0.9").score == 0.9
    assert _parse_program_line("p", "1.5").error == "judge score 1.5 is outside [0, 1]"
    assert _parse_program_line("p", "great").error is not None
    assert Material("i", "", "", None, Path()).diff == ""
