"""Reports from a real store: fairness flags, every format, two runs compared, gates, and the
HTML report rendered by a real headless Chromium."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import t as student_t

from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.report.comparison import compare_runs, render_comparison
from pytest_hemra.report.formats import render
from pytest_hemra.report.gates import parse_gate, tripped
from pytest_hemra.report.tables import build_report
from pytest_hemra.store import Store
from tests.records import trial_result

TASKS = [f"task-{n}" for n in range(8)]


def spec(
    harnesses: list[str], model: str | None = "m-1", timeout: float | None = None
) -> dict[str, Any]:
    return {
        "spec": {
            "harnesses": harnesses, "baseline": harnesses[0], "model": model,
            "timeout_secs": timeout, "attempts": 2,
        },
        "datasets": {"ds": {"digest": "d" * 64, "path": "/ds", "tasks": TASKS}},
        "harnesses": {h: {"digest": h[0] * 64} for h in harnesses},
    }  # fmt: skip


def result(reward: float, **usage: Any) -> dict[str, Any]:
    return {
        "outcome": "pass" if reward >= 1 else "fail", "reward": reward,
        "rewards": {"reward": reward}, "exit_code": 0, "error": None, "finished_at": 1.0,
        "duration": 2.0, "phases": {}, "trial_dir": "x",
        "usage": {
            "calls": 1, "input_tokens": 100, "output_tokens": 50, "cache_read_tokens": 0,
            "cache_write_tokens": 0, "cost": 0.01, "models": ["m-1"], **usage,
        },
    }  # fmt: skip


def record_run(store: Store, run_id: str, outcomes: dict[str, Any], **kwargs: Any) -> None:
    """`outcomes[harness](task, attempt)` -> a result dict, or None for a trial never run."""
    harnesses = list(outcomes)
    plan = [PlannedTrial("ds", t, h, a) for t in TASKS for h in harnesses for a in (1, 2)]
    folder = store.path.parent if store.path is not None else Path("/srv/trials")  # PostgreSQL
    store.record_plan(run_id, run_id, spec(harnesses, **kwargs), folder, plan)
    for trial in store.trials(run_id):
        found = outcomes[trial.harness](trial.task, trial.attempt)
        if found is not None:
            store.finish_trial(trial.id, trial_result(found))


@pytest.fixture
def unfair(tmp_path: Path) -> Store:
    """base solves everything; short skips two tasks and errs on one; chatty calls a second
    model; unpriced used a model with no price."""
    store = Store(tmp_path / "s.db")
    record_run(
        store,
        "unfair",
        {
            "base": lambda task, attempt: result(1.0),
            "short": lambda task, attempt: (
                None
                if task in TASKS[:2]
                else {**result(0.0), "outcome": "infra_error", "reward": None}
                if task == TASKS[2]
                else result(1.0 if attempt == 1 else 0.0)
            ),
            "chatty": lambda task, attempt: result(
                1.0, other_model_tokens=60, models=["m-1", "m-big"]
            ),
            "unpriced": lambda task, attempt: result(1.0, cost=None, models=["m-secret"]),
        },
    )
    return store


def test_each_unfair_condition_is_flagged_under_its_table(unfair: Store) -> None:
    text = render(build_report(unfair, "unfair"), "text")
    assert (
        "! 3 of 8 tasks left out of every harness's numbers (task-0, task-1: short planned;"
        " task-2: short infra_error): every number is over the same 5 tasks"
    ) in text
    assert "ds@dddddddddddd (8 tasks, 5 counted)" in text
    assert "! short: 6 trials unfinished, excluded from scores: 2 infra_error, 4 planned" in text
    assert "! chatty: 40% of its tokens went to other models than m-1 (m-big)" in text
    assert (
        "! model m-secret has no price: its cost is unknown, and so is the cost of unpriced"
        ' (a run file\'s [prices."m-secret"] sets one)'
    ) in text
    assert "! short: its difference from the baseline" in text  # 5 tasks cannot tell
    assert text.splitlines()[5].startswith("base (baseline)")


def test_a_cancelled_runs_report_says_so_in_a_few_lines_none_of_the_baseline_alone(
    tmp_path: Path,
) -> None:
    """Cancelled after 2 of 8 tasks: one line says how many trials were cancelled and whose,
    one how many tasks the comparison covers; nothing is said of the baseline against itself
    (it said `nop: ... compared on the tasks both ran`), nor repeated per harness."""
    store = Store(tmp_path / "s.db")
    done = TASKS[:2]
    record_run(
        store,
        "r",
        {
            "nop": lambda task, attempt: result(0.0) if task in done else None,
            "oracle": lambda task, attempt: result(1.0) if task in done else None,
        },
    )
    left = [t.id for t in store.trials("r") if not t.is_finished]
    assert store.cancel_trials(left, "cancelled by hemra cancel") == 24

    text = render(build_report(store, "r"), "text")

    flags = [line for line in text.splitlines() if line.startswith("!")]
    assert flags[:2] == [
        "! 24 trials cancelled (nop 12, oracle 12), excluded from scores",
        "! 6 of 8 tasks left out of every harness's numbers (task-2, task-3, task-4, task-5,"
        " task-6 and 1 more: nop cancelled, oracle cancelled): every number is over the same 2"
        " tasks",
    ]
    assert len(flags) <= 3  # and perhaps: too few tasks to tell oracle from nop
    assert not [line for line in flags if line.startswith("! nop:")]
    assert "(8 tasks, 2 counted)" in text and "1 tasks" not in text


def test_a_baseline_short_of_tasks_is_said_to_narrow_every_comparison(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    record_run(
        store,
        "r",
        {
            "base": lambda task, attempt: None if task == TASKS[0] else result(1.0),
            "other": lambda task, attempt: result(1.0),
        },
    )
    text = render(build_report(store, "r"), "text")
    assert (
        "! 1 of 8 tasks left out of every harness's numbers (task-0: base planned): every number"
        " is over the same 7 tasks"
    ) in text
    assert "! base: 2 trials planned, excluded from scores" in text
    assert "! other:" not in text


def test_statistics_in_the_table_are_paired_and_clustered(unfair: Store) -> None:
    report = build_report(unfair, "unfair")
    (dataset,) = report.datasets
    rows = {row.harness: row for row in dataset.harnesses}
    short = rows["short"]
    assert short.tasks == 5 and short.scored == 10 and short.passes == 5
    # one task set: the baseline's numbers leave the three tasks short has no score on too
    assert short.versus is not None and short.versus.n_tasks == 5 and short.versus.only_b == 0
    assert rows["base"].tasks == 5 and rows["base"].scored == 16  # counts are of every trial
    assert short.versus.diff == pytest.approx(-0.5)
    assert short.pass_at_k[2] == pytest.approx(1.0) and short.pass_hat_k[2] == 0.0
    assert rows["base"].reward is not None and rows["base"].reward.mean == 1.0
    assert rows["unpriced"].cost is None and rows["base"].cost is not None
    assert rows["base"].cost.total == pytest.approx(0.16)
    assert rows["base"].tokens.median == 150


def test_pass_at_k_is_over_the_tasks_with_every_attempt_scored(tmp_path: Path) -> None:
    # one task fails its three attempts; the other passes two and loses the third to an infra
    # error: averaged per k, pass@1 read 0.5 (both tasks) and pass@3 0.0 (the first only); now
    # the task with an unscored attempt leaves every number, the mean as well as every pass@k
    store = Store(tmp_path / "s.db")
    tasks = ["fails", "infra"]
    recorded = spec(["agent"])
    recorded["spec"]["attempts"] = 3
    recorded["datasets"]["ds"]["tasks"] = tasks
    plan = [PlannedTrial("ds", t, "agent", a) for t in tasks for a in (1, 2, 3)]
    store.record_plan("r", "r", recorded, store.path.parent, plan)
    for trial in store.trials("r"):
        if trial.task == "fails":
            store.finish_trial(trial.id, trial_result(result(0.0)))
        elif trial.attempt < 3:
            store.finish_trial(trial.id, trial_result(result(1.0)))
        else:
            infra = {**result(0.0), "outcome": "infra_error", "reward": None}
            store.finish_trial(trial.id, trial_result(infra))
    report = build_report(store, "r")
    (row,) = report.datasets[0].harnesses
    assert row.pass_at_k == {1: 0.0, 2: 0.0, 3: 0.0}
    assert row.pass_hat_k == {1: 0.0, 2: 0.0, 3: 0.0}
    assert (row.pass_k_tasks, row.pass_k_left_out) == (1, 0)
    assert row.reward is not None and (row.reward.mean, row.reward.n_tasks) == (0.0, 1)
    text = render(report, "text")
    assert "pass@k tasks" in text and "(2 tasks, 1 counted)" in text
    assert "left out of every harness's numbers (infra: agent infra_error)" in text
    (exported,) = csv.DictReader(io.StringIO(render(report, "csv")))
    assert (exported["pass_k_tasks"], exported["pass_k_left_out"]) == ("1", "0")
    assert json.loads(exported["pass_at_k"]) == {"1": 0.0, "2": 0.0, "3": 0.0}
    (dataset,) = json.loads(render(report, "json"))["datasets"]
    (harness,) = dataset["harnesses"]
    assert (harness["pass_k_tasks"], harness["pass_k_left_out"]) == (1, 0)
    assert dataset["tasks_left_out"] == {"infra": ["agent infra_error"]}


def test_every_format_holds_the_same_numbers(unfair: Store, tmp_path: Path) -> None:
    report = build_report(unfair, "unfair")
    data = json.loads(render(report, "json"))
    assert data["datasets"][0]["harnesses"][1]["versus"]["diff"] == pytest.approx(-0.5)
    assert {f["kind"] for f in data["datasets"][0]["flags"]} >= {
        "task_set", "unfinished", "other_models", "unknown_price", "too_few_tasks",
    }  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert [r["harness"] for r in rows] == ["base", "short", "chatty", "unpriced"]
    assert float(rows[1]["diff"]) == pytest.approx(-0.5) and rows[3]["cost_total"] == ""
    markdown = render(report, "markdown")
    assert "| base (baseline)" in markdown and "- 3 of 8 tasks left out" in markdown
    assert data["datasets"][0]["counted_tasks"] == TASKS[3:]
    assert data["datasets"][0]["tasks_left_out"] == {
        "task-0": ["short planned"], "task-1": ["short planned"], "task-2": ["short infra_error"],
    }  # fmt: skip
    html = render(report, "html")
    assert html.startswith("<!doctype html>") and "<svg" in html


def test_html_is_autoescaped(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    record_run(store, "r", {"<script>alert(1)</script>": lambda task, attempt: result(1.0)})
    html = render(build_report(store, "r"), "html")
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_task_one_harness_could_not_score_leaves_every_harness_numbers_and_gates(
    tmp_path: Path,
) -> None:
    """`short`'s last task ended infra_error past its retries; `full` scored 0 on it. The task
    leaves both rows: each mean, difference and `score<X` gate is over the same 7 tasks."""
    store = Store(tmp_path / "s.db")
    infra = {**result(0.0), "outcome": "infra_error", "reward": None}
    record_run(
        store,
        "r",
        {
            "full": lambda task, attempt: result(0.0 if task == TASKS[7] else 1.0),
            "short": lambda task, attempt: infra if task == TASKS[7] else result(1.0),
        },
    )
    report = build_report(store, "r")
    (dataset,) = report.datasets
    full, short = dataset.harnesses
    assert full.tasks == short.tasks == 7 and dataset.tasks_left_out == {
        "task-7": ["short infra_error"]
    }
    assert full.reward == short.reward and full.reward is not None and full.reward.mean == 1.0
    assert short.versus is not None and (short.versus.diff, short.versus.n_tasks) == (0.0, 7)
    assert [f.kind for f in dataset.flags if f.kind == "task_set"] == ["task_set"]
    assert tripped([parse_gate("score<1")], store.trials("r"), report) == []
    assert tripped([parse_gate("failure")], store.trials("r"), report) == [
        "2 scored trials did not pass"
    ]


def test_two_runs_compared_flag_a_regression(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    record_run(store, "before", {"agent": lambda task, attempt: result(1.0)}, timeout=600)
    record_run(
        store,
        "after",
        {"agent": lambda task, attempt: result(0.0 if task != TASKS[0] else 1.0)},
        timeout=900,
    )
    comparison = compare_runs(store, "before", "after")
    ((name, change),) = comparison.regressions
    assert name == "ds" and change.change.diff == pytest.approx(-7 / 8)
    # paired t over 8 tasks, 7 changed by -1 and 1 by 0: mean -7/8, sd sqrt(1/8), t = -7
    assert change.change.p_value == pytest.approx(2 * student_t.sf(7, df=7))
    assert change.change.high < 0 and change.change.is_significant
    text = render_comparison(comparison)
    assert "REGRESSION" in text and "! different timeouts: 600 before, 900 after" in text
    gates = [parse_gate("regression")]
    reasons = tripped(gates, store.trials("after"), build_report(store, "after"), comparison)
    assert reasons == ["agent on ds: -0.875 vs run before (p=0.000)"]
    assert tripped(gates, store.trials("before"), build_report(store, "before"), None) == []


def test_hemra_report_writes_each_format_and_compares(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    store = Store(tmp_path / "s.db")
    record_run(store, "before", {"agent": lambda task, attempt: result(1.0)})
    record_run(store, "after", {"agent": lambda task, attempt: result(0.0)})
    for fmt in ("json", "csv", "html", "markdown"):
        out = tmp_path / f"r.{fmt}"
        done = pytester.run(
            "hemra", "report", "after", "--store", str(store.path), "--format", fmt, "-o", out
        )
        assert done.ret == 0 and out.stat().st_size > 100, fmt
    compared = pytester.run("hemra", "report", "before", "after", "--store", str(store.path))
    assert compared.ret == 0
    compared.stdout.fnmatch_lines(["*agent*1.000*0.000*-1.000*REGRESSION*"])


def test_html_report_opens_in_headless_chromium(unfair: Store, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("needs Debian's chromium (apt-get install chromium); .ci/run installs it")
    page = tmp_path / "report.html"
    page.write_text(render(build_report(unfair, "unfair"), "html"))
    shot = tmp_path / "report.png"
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"]
    logged = subprocess.run(
        [*argv, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert logged.returncode == 0
    assert "Uncaught" not in logged.stderr and "CONSOLE" not in logged.stderr
    dom = logged.stdout
    assert dom.count("<tr>") == 5 and "<circle" in dom and "chatty" in dom
    shot_run = subprocess.run(
        [*argv, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120
    )
    assert shot_run.returncode == 0 and shot.stat().st_size > 10_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hemra_show_prints_one_trial(pytester: pytest.Pytester, unfair: Store) -> None:
    trial = next(t for t in unfair.trials("unfair") if t.harness == "chatty")
    result = pytester.run("hemra", "show", trial.id, "--store", str(unfair.path))
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            f"trial {trial.id}: {trial.item_id}",
            "  status finished, outcome pass, reward 1",
            '  rewards {"reward": 1.0}',
            "  tokens 150 (input 100, output 50, cache read 0, cache write 0); 1 call;*",
            "folder x",
        ]
    )
    missing = pytester.run("hemra", "show", "nope.00001", "--store", str(unfair.path))
    assert missing.ret == 4 and "'nope' is not a run id (expected" in missing.stderr.str()
    absent = pytester.run("hemra", "show", f"{trial.run_id}.00999", "--store", str(unfair.path))
    assert absent.ret == 4 and f"no trial '{trial.run_id}.00999' in run" in absent.stderr.str()


def test_a_run_of_several_harnesses_on_ten_tasks_says_where_the_variance_comes_from(
    tmp_path: Path,
) -> None:
    """Under the first table of each dataset (and in every format): the mixed model's method,
    shares and coefficients; with fewer than ten tasks, nothing is fitted and nothing said."""
    tasks = [f"t{n:02d}" for n in range(12)]
    store = Store(tmp_path / "s.db")
    plan = [PlannedTrial("ds", t, h, a) for t in tasks for h in ("base", "better") for a in (1, 2)]
    recorded = spec(["base", "better"])
    recorded["datasets"]["ds"]["tasks"] = tasks
    store.record_plan("var", "var", recorded, tmp_path, plan)
    for trial in store.trials("var"):
        hard = int(trial.task[1:]) % 3 == 0  # a third of the tasks nobody solves
        solved = not hard and (trial.harness == "better" or trial.attempt == 1)
        store.finish_trial(trial.id, trial_result(result(1.0 if solved else 0.0)))
    report = build_report(store, "var")
    (dataset,) = report.datasets
    assert dataset.variance is not None and dataset.variance.note is None
    assert set(dataset.variance.shares) >= {"harness", "task", "residual"}
    assert dataset.variance.coefficients[0].term == "harness[better]"
    assert dataset.variance.coefficients[0].estimate > 0
    text = render(report, "text")
    assert "Where the variance comes from (48 trials, 12 tasks)" in text
    assert "Where the variance comes from" in render(report, "markdown")
    assert json.loads(render(report, "json"))["datasets"][0]["variance"]["n_tasks"] == 12

    few = Store(tmp_path / "few.db")
    record_run(few, "few", {"base": lambda t, a: result(1.0), "b": lambda t, a: result(0.0)})
    assert build_report(few, "few").datasets[0].variance is None
