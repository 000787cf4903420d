"""The harness x model matrix: every harness under every model of `models`, a cell per pair,
with its own items, gateway rule, tokens and tables."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import TaskMaker
from pytest_hemra.core.errors import SpecError
from pytest_hemra.execute.gateway.scripted import scripted_usage
from pytest_hemra.execute.gateway.wire import Wire
from pytest_hemra.report.comparison import compare_runs
from pytest_hemra.report.formats import render_text
from pytest_hemra.report.tables import build_report
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.plan import resolve_plan
from pytest_hemra.store import Store

MODELS = ("hemra/scripted-a", "hemra/scripted-b")
# one chat call under the model it was given ({model}), which it also writes down; passes only
# under scripted-b (it writes the task's answer there), so the two models differ
CHATTY = '''kind = "program"
provider = "openai"
command = ["python3", "-c", """
import json, os, urllib.request
model = '{model}'
body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request('{base_url}/v1/chat/completions', body,
    {"Authorization": "Bearer {api_key}", "Content-Type": "application/json"})
urllib.request.urlopen(request, timeout=30).read()
open('/app/model.txt', 'w').write(model)
"""]
'''
TASKS = ("fix-test",)  # one task keeps the suite short: 12 trials


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_matrix_run_has_a_cell_per_harness_and_model_with_its_own_items_tokens_and_tables(
    pytester: pytest.Pytester, tmp_path: Path, write_harness: Callable[..., Path]
) -> None:
    write_harness("chatty", CHATTY)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle", "chatty"]\ndatasets = ["hemra-offline"]\n'
        f"models = {json.dumps(list(MODELS))}\nattempts = 3\ntasks = {json.dumps(list(TASKS))}\n"
        'baseline = "hemra/scripted-b"\n'
    )
    selected = pytester.runpytest("--hemra-run", str(run_file), "--collect-only", "-q",
                                  "-k", "chatty and scripted-a")  # fmt: skip
    selected.stdout.fnmatch_lines(["hemra-offline::fix-test[[]chatty@hemra/scripted-a-1[]]"])
    assert "3/12 tests collected (9 deselected)" in selected.stdout.str()

    store_path = tmp_path / "s.db"
    result = pytester.runpytest(
        "--hemra-run", str(run_file), "--hemra-store", str(store_path), "-n", "2"
    )
    result.assert_outcomes(passed=6, failed=6)  # oracle passes; chatty writes no answer
    store = Store(store_path)
    (run,) = store.runs()
    trials = store.trials(run.id)
    assert Counter(t.cell for t in trials) == {
        f"{h}@{m}": len(TASKS) * 3 for h in ("oracle", "chatty") for m in MODELS
    }
    assert "hemra-offline::fix-test[chatty@hemra/scripted-b-2]" in {t.item_id for t in trials}
    per_call = scripted_usage(Wire.CHAT).total_tokens
    for trial in trials:
        if trial.harness == "chatty":  # one call, under its cell's model, counted to the token
            assert trial.tokens == per_call and trial.other_model_tokens == 0, trial.item_id
            diff = (Path(trial.trial_dir or "") / "diff.patch").read_text()
            assert f"+{trial.model}" in diff
        else:
            assert trial.tokens == 0

    report = build_report(store, run.id)
    views = [(d.view, d.axis, [r.harness for r in d.harnesses]) for d in report.datasets]
    assert views == [
        ("model hemra/scripted-a", "harness", ["oracle", "chatty"]),
        ("model hemra/scripted-b", "harness", ["oracle", "chatty"]),
        ("harness oracle", "model", ["hemra/scripted-b", "hemra/scripted-a"]),  # the baseline
        ("harness chatty", "model", ["hemra/scripted-b", "hemra/scripted-a"]),
    ]
    within_model = report.datasets[0].harnesses[1]
    assert within_model.versus is not None and within_model.versus.diff == -1.0
    assert within_model.tokens.total == len(TASKS) * 3 * per_call  # this cell's alone
    assert within_model.disagree == 0.0  # every task's three attempts agree
    across_models = report.datasets[3].harnesses[1]
    assert across_models.versus is not None and across_models.versus.diff == 0.0

    text = result.stdout.str()  # both table shapes in the summary
    assert "(1 task) - model hemra/scripted-a" in text and "(1 task) - harness chatty" in text
    narrow = render_text(report, width=80)
    assert max(len(line) for line in narrow.splitlines() if "|" not in line and "!" not in line
               and "left out" not in line and "HEMRA run" not in line) <= 80  # fmt: skip
    assert "mean reward [95% CI]" in narrow and "left out to fit 80 columns" in narrow
    exported = json.loads(pytester.run(
        "hemra", "report", run.id, "--store", str(store_path), "--format", "json"
    ).stdout.str())  # fmt: skip
    assert [d["view"] for d in exported["datasets"]] == [v[0] for v in views]
    (compared,) = compare_runs(store, run.id, run.id).datasets  # hemra report A B: by cell
    assert [c.harness for c in compared.harnesses] == [
        f"{h}@{m}" for h in ("oracle", "chatty") for m in MODELS
    ]


@pytest.mark.parametrize(
    ("run_toml", "harness_toml", "expected"),
    [
        ('models = ["a", "b", "a"]\n', None, r"key 'models': .*expected each model once"),
        ('model = "a"\nmodels = ["a", "b"]\n', None, r"'model' \(one\) or 'models'"),
        ('models = ["a", "b"]\nbaseline = "c"\n', None, r"key 'baseline': 'c' is not one of"),
        ('models = ["a", "b"]\nbaseline = "h@c"\n', None, r"key 'baseline': 'h@c' is not"),
        ('models = ["a", "b"]\n', 'model = "c"\n', r"pins model 'c', which is not one of"),
    ],
)
def test_malformed_model_lists_are_refused_at_resolve_in_one_line(
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    run_toml: str,
    harness_toml: str | None,
    expected: str,
) -> None:
    make_task("one")
    write_harness("h", 'kind = "program"\ncommand = ["true"]\n' + (harness_toml or ""))
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["h"]\ndatasets = ["ds"]\n' + run_toml)
    with pytest.raises(SpecError, match=expected) as refused:
        resolve_plan(run_file, Overrides(), tmp_path)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / ".hemra").exists()


def test_a_harness_pinned_to_one_model_joins_only_that_models_cells(
    tmp_path: Path, make_task: TaskMaker, write_harness: Callable[..., Path]
) -> None:
    make_task("one")
    write_harness("free", 'kind = "program"\ncommand = ["true"]\n')
    write_harness("pinned", 'kind = "program"\ncommand = ["true"]\nmodel = "b"\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["free", "pinned"]\ndatasets = ["ds"]\nmodels = ["a", "b"]\n'
        'baseline = "pinned@b"\n'
    )
    plan = resolve_plan(run_file, Overrides(), tmp_path)
    assert [t.item_id for t in plan.trials] == [
        "ds::one[free@a-1]", "ds::one[free@b-1]", "ds::one[pinned@b-1]"
    ]  # fmt: skip
    assert (plan.spec.baseline_harness, plan.spec.baseline_model) == ("pinned", "b")
    one = resolve_plan(run_file, Overrides(models=["b"]), tmp_path)  # -m b: the one-model form
    assert [t.item_id for t in one.trials] == ["ds::one[free-1]", "ds::one[pinned-1]"]


def test_the_dry_run_prints_cells_trials_and_a_cost_bound_from_the_caps(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-sentinel-dry-run")
    make_task("one")
    make_task("two")
    write_harness("caller", 'kind = "program"\ncommand = ["true"]\nprovider = "anthropic"\n')
    run_file = tmp_path / "run.toml"
    base = (
        'harnesses = ["oracle", "caller"]\ndatasets = ["ds"]\nattempts = 2\n'
        'models = ["claude-sonnet-4-5", "claude-haiku-4-5"]\nbaseline = "claude-haiku-4-5"\n'
    )
    run_file.write_text(base + "[gateway]\ntrial_max_tokens = 10000\n")
    shown = pytester.run("hemra", "run", str(run_file), "--dry-run")
    assert shown.ret == 0, shown.stderr.str()
    # caller: 4 trials a model; at most 10,000 tokens each at the model's dearest price
    # (sonnet's output $15/M, haiku's $5/M): 4 * 0.15 + 4 * 0.05; the oracle calls none
    shown.stdout.fnmatch_lines([
        "models: claude-sonnet-4-5, claude-haiku-4-5 (baseline)",
        "cells: 4 (harness x model)",
        "trials: 2 tasks x 4 cells x 2 attempts = 16",
        "cost: at most $0.80 (from the caps)",
    ])  # fmt: skip
    run_file.write_text(base + "cell_budget_usd = 0.1\n")
    capped = pytester.run("hemra", "run", str(run_file), "--dry-run")
    capped.stdout.fnmatch_lines(["cost: at most $0.20 (from the caps)"])
    run_file.write_text(base)
    unbounded = pytester.run("hemra", "run", str(run_file), "--dry-run")
    unbounded.stdout.fnmatch_lines(["cost: no upper bound (set budget_usd, *"])
    assert not (pytester.path / ".hemra").exists()


@pytest.mark.usefixtures("docker_test")
def test_a_cells_budget_refuses_its_calls_once_spent_and_names_itself(
    pytester: pytest.Pytester,
    tmp_path: Path,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cell_budget_usd far below one call's worst case: every call of the cell is refused,
    recorded as the cell budget's, while the run's budget_usd had plenty left."""
    from tests.upstream import running_upstream

    monkeypatch.setenv("OPENAI_API_KEY", "sk-sentinel-cell-budget")
    write_harness("chatty", CHATTY)
    with running_upstream() as upstream:
        run_file = tmp_path / "run.toml"
        run_file.write_text(
            'harnesses = ["chatty"]\ndatasets = ["hemra-offline"]\ntasks = ["fix-test"]\n'
            'models = ["gpt-5", "gpt-5-mini"]\nbudget_usd = 100.0\ncell_budget_usd = 1e-9\n'
            f'[providers.openai]\nbase_url = "{upstream.url}/v1"\n'
        )
        store_path = tmp_path / "s.db"
        pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store_path))
        assert upstream.seen == []  # nothing reached the upstream
    store = Store(store_path)
    (run,) = store.runs()
    for trial in store.trials(run.id):
        (call,) = store.calls(trial=trial.id)
        assert call.status == 400 and call.error == "refused: cell budget", trial.item_id
        assert trial.stopped_by == "cell budget"
