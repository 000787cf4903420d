"""Rewards of several keys, as Harbor records them: which is the headline, how a multi-step
trial rolls its steps up, and how reports show every key (core/reward.py, report/rewardkeys.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_hemra.core.errors import SpecError, VerifierError
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.core.reward import has_no_headline, headline_key, parse_reward, trial_reward
from pytest_hemra.core.trial import StepResult
from pytest_hemra.report.formats import render
from pytest_hemra.report.tables import build_report
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.spec import load_run_spec
from pytest_hemra.resolve.taskconfig import TaskConfig
from pytest_hemra.run.steps import rolled_up
from pytest_hemra.store import Store
from tests.records import trial_result


@pytest.mark.parametrize(
    ("rewards", "named", "headline"),
    [
        ({"reward": 0.5, "checks": 1.0}, ("checks",), "reward"),  # `reward` always wins
        ({"correctness": 1.0, "performance": 0.5}, ("performance",), "performance"),
        # the run's key before the task's; a named key the trial lacks is passed over
        ({"a": 1.0, "b": 0.0}, ("b", "a"), "b"),
        ({"a": 1.0, "b": 0.0}, ("missing", "a"), "a"),
        ({"score": 0.25}, (), "score"),  # the only key
        ({"correctness": 1.0, "performance": 0.5}, (), None),  # several, none named
        ({"correctness": 1.0, "performance": 0.5}, ("missing",), None),
    ],
)
def test_the_headline_is_reward_else_a_named_key_else_the_only_one(
    rewards: dict[str, float], named: tuple[str, ...], headline: str | None
) -> None:
    assert headline_key(rewards, named) == headline
    assert has_no_headline(rewards, named) == (headline is None)


def test_a_trial_without_a_headline_is_scored_by_its_lowest_key() -> None:
    both = {"correctness": 1.0, "performance": 1.0}
    one_short = {"correctness": 1.0, "performance": 0.5}
    assert trial_reward(both) == 1.0  # every key at the threshold: a pass
    assert trial_reward(one_short) == 0.5  # a fail, though correctness is 1
    assert trial_reward(one_short, ("correctness",)) == 1.0
    files = {"reward.json": json.dumps(one_short).encode()}
    assert parse_reward(files, ("performance",)) == (0.5, one_short)
    with pytest.raises(VerifierError, match=r"reward.json key 'performance': expected a number"):
        parse_reward({"reward.json": b'{"correctness": 1, "performance": "fast"}'})


def step(name: str, rewards: dict[str, float] | None) -> StepResult:
    """A step that ran with `rewards`, or (None) one skipped below an earlier min_reward."""
    if rewards is None:
        return StepResult(name, None, {}, None, False, 0.0, "skipped: ...", skipped=True)
    return StepResult(name, trial_reward(rewards), rewards, 0, False, 1.0)


def test_skipped_steps_are_left_out_of_the_mean_as_harbor_leaves_them_out() -> None:
    steps = [step("one", {"reward": 1.0}), step("two", {"reward": 0.5}), step("three", None)]
    assert rolled_up(steps, "mean") == (0.75, {"reward": 0.75})  # not (1 + 0.5 + 0) / 3
    # "final": the last step that ran (a skipped one has no result)
    assert rolled_up(steps, "final") == (0.5, {"reward": 0.5})


def test_steps_roll_up_key_by_key_and_final_keeps_the_last_steps_keys() -> None:
    steps = [
        step("one", {"correctness": 1.0}),
        step("two", {"correctness": 0.5, "performance": 1.0}),
    ]
    # each key's mean over the steps that ran, a key a step lacks counting 0 for it (Harbor's)
    reward, rewards = rolled_up(steps, "mean")
    assert rewards == {"correctness": 0.75, "performance": 0.5}
    assert reward == 0.5  # no headline: the lowest key
    assert rolled_up(steps, "mean", ("correctness",))[0] == 0.75
    reward, rewards = rolled_up(steps, "final", ("performance",))
    assert rewards == {"correctness": 0.5, "performance": 1.0}
    assert reward == 1.0


def test_the_run_and_the_task_name_their_headline_key(tmp_path: Path) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["a"]\ndatasets = ["d"]\n[report]\nreward_key = "speed"\n')
    assert load_run_spec(run_file, Overrides()).report.reward_key == "speed"
    run_file.write_text('harnesses = ["a"]\ndatasets = ["d"]\n[report]\nreward_kye = "speed"\n')
    with pytest.raises(SpecError, match=r"run.toml: key 'report.reward_kye'"):
        load_run_spec(run_file, Overrides())
    config = TaskConfig.model_validate({"hemra": {"reward_key": "correctness"}})
    assert config.hemra.reward_key == "correctness"


TASKS = [f"task-{n}" for n in range(6)]


def record_run(
    store: Store,
    rewards: dict[str, Any],
    run_key: str | None = None,
    task_keys: dict[str, str] | None = None,
) -> None:
    """One attempt of each harness on each task; `rewards[harness](task)` its rewards."""
    plan = {
        "spec": {
            "harnesses": list(rewards),
            "baseline": next(iter(rewards)),
            "report": {"reward_key": run_key},
        },
        "datasets": {"ds": {"digest": "d" * 64, "tasks": TASKS, "reward_keys": task_keys or {}}},
        "harnesses": {h: {"digest": h[0] * 64} for h in rewards},
    }
    trials = [PlannedTrial("ds", t, h, 1) for t in TASKS for h in rewards]
    store.record_plan("r", "r", plan, store.path.parent, trials)
    for trial in store.trials("r"):
        found = rewards[trial.harness](trial.task)
        reward = trial_reward(found, plan_keys(run_key, (task_keys or {}).get(trial.task)))
        store.finish_trial(
            trial.id,
            trial_result({
                "outcome": "pass" if reward >= 1 else "fail", "reward": reward,
                "rewards": found, "exit_code": 0, "error": None, "finished_at": 1.0,
                "duration": 2.0, "phases": {}, "trial_dir": "x",
            }),
        )  # fmt: skip


def plan_keys(*keys: str | None) -> tuple[str, ...]:
    return tuple(k for k in keys if k is not None)


def metrics(correctness: float, performance: float) -> dict[str, float]:
    return {"correctness": correctness, "performance": performance}


def test_a_report_shows_each_key_with_its_interval_and_compares_keys_without_a_headline(
    tmp_path: Path,
) -> None:
    """base is correct and slow; fast is fast and half correct. With no headline named, the
    table says so and one table a key compares them; every key is a column with its CI."""
    store = Store(tmp_path / "s.db")
    record_run(
        store,
        {
            "base": lambda task: metrics(1.0, 0.0),
            "fast": lambda task: metrics(1.0 if task in TASKS[:3] else 0.0, 1.0),
        },
    )
    report = build_report(store, "r")
    main, correctness, performance = report.datasets
    assert [row.reward.mean for row in main.harnesses if row.reward] == [0.0, 0.5]
    assert (correctness.view, correctness.reward_key) == ("key correctness", "correctness")
    assert [row.reward.mean for row in correctness.harnesses if row.reward] == [1.0, 0.5]
    assert [row.reward.mean for row in performance.harnesses if row.reward] == [0.0, 1.0]
    versus = performance.harnesses[1].versus
    assert versus is not None and versus.diff == 1.0 and versus.is_significant
    fast = main.harnesses[1].keys["correctness"]
    assert fast is not None and (fast.mean, fast.n_tasks) == (0.5, 6) and fast.low < fast.high

    text = render(report, "text")
    assert (
        "! 6 tasks wrote several reward keys and none is the headline (task-0: correctness,"
        " performance;"
    ) in text
    assert (
        "each trial's reward is its lowest key (a pass needs every key at the threshold), and"
        " the tables key 'correctness', key 'performance' compare each key alone; to pick one,"
        ' set [report] reward_key = "correctness" in the run file'
    ) in " ".join(text.split())
    assert "ds@dddddddddddd (6 tasks) - key performance" in text
    assert "key correctness [95% CI]" in text.splitlines()[3]
    rows = list(csv.DictReader(render(report, "csv").splitlines()))
    assert [(r["view"], r["harness"]) for r in rows][:3] == [
        ("", "base"),
        ("", "fast"),
        ("key correctness", "base"),
    ]
    assert json.loads(rows[1]["reward_keys"])["correctness"]["mean"] == 0.5
    exported = json.loads(render(report, "json"))["datasets"][0]["harnesses"][1]
    assert exported["keys"]["performance"]["mean"] == 1.0


def test_a_named_headline_is_the_reward_and_the_other_keys_are_columns(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    record_run(
        store,
        {"base": lambda task: metrics(1.0, 0.0), "fast": lambda task: metrics(0.0, 1.0)},
        task_keys=dict.fromkeys(TASKS, "performance"),
        run_key="correctness",  # the run's choice wins over the task's
    )
    (main,) = build_report(store, "r").datasets
    assert [row.reward.mean for row in main.harnesses if row.reward] == [1.0, 0.0]
    assert [sorted(row.keys) for row in main.harnesses] == [["performance"], ["performance"]]
    text = render(build_report(store, "r"), "text")
    assert "key performance [95% CI]" in text and "none is the headline" not in text


@pytest.mark.usefixtures("docker_test")
def test_oracle_passes_and_nop_fails_the_multi_metric_and_skipped_step_tasks(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """examples/multi-metric.toml, for real: a reward.json of two metrics and no `reward` (the
    report names the keys and compares each), a skipped step left out of the mean, and "final"
    carrying the last step's keys; `hemra show` says which is which."""
    run_file = Path(__file__).parent.parent / "examples" / "multi-metric.toml"
    store_path = tmp_path / "hemra.db"
    result = pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store_path))
    result.assert_outcomes(passed=3, failed=3)
    store = Store(store_path)
    (run,) = store.runs()
    trials = {(t.task, t.harness): t for t in store.trials(run.id)}
    for (task, harness), trial in trials.items():
        expected = (("pass", 1.0) if harness == "oracle" else ("fail", 0.0), task)
        assert ((trial.outcome, trial.reward), task) == expected, trial.error
    assert trials["multi-metric", "oracle"].rewards == metrics(1.0, 1.0)
    assert trials["final-keys", "oracle"].rewards == {"reward": 1.0, "sorted": 1.0}
    assert trials["final-keys", "nop"].rewards == {"reward": 0.0, "words": 0.0}
    skipped = store.steps(trials["gated-steps", "nop"].id)[1]
    assert skipped["reward"] is None and skipped["error"].startswith("skipped: step fix")
    result.stdout.fnmatch_lines(
        [
            "*! 1 task wrote several reward keys and none is the headline (multi-metric:"
            " correctness, performance)*",
            "*harbor-features@* (1 task) - key correctness*",
            "*harbor-features@* (1 task) - key performance*",
        ]
    )
    text = render(build_report(store, run.id), "text")
    assert "key sorted [95% CI]" in text and "key words [95% CI]" in text

    def show(task: str, harness: str) -> str:
        trial = trials[task, harness]
        shown = pytester.run("hemra", "show", trial.id, "--store", str(store_path))
        assert shown.ret == 0
        return shown.stdout.str()

    assert '"performance": 1.0} (no headline: the reward is the lowest key;' in show(
        "multi-metric", "oracle"
    )
    assert "step 2 extend: skipped: step fix scored below its min_reward 1.0 (left out" in show(
        "gated-steps", "nop"
    )
