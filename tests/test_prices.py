"""Prices come from Pydantic's genai-prices (shipped with its package, read offline): every model
of the major providers is priced, cached input as the dataset defines it; a run file's
`[prices."MODEL"]` wins; a model without a price is named in a flag under the report's table;
the price source and its version are recorded with the run and shown in its report."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from genai_prices.data_snapshot import get_snapshot
from genai_prices.types import (
    ClauseAnd,
    ClauseEquals,
    ClauseOr,
    ClauseRegex,
    ClauseStartsWith,
    ModelInfo,
)

from pytest_hemra.core.errors import SpecError
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.execute.gateway.prices import PriceTable, cost_of, price_table
from pytest_hemra.execute.gateway.wire import CallUsage
from pytest_hemra.report.formats import render
from pytest_hemra.report.tables import build_report
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.prices import PriceOverride, dataset_version, use_run_prices
from pytest_hemra.resolve.spec import load_run_spec
from pytest_hemra.store import Store
from tests.records import trial_result

REPO = Path(__file__).resolve().parent.parent
MAJOR_PROVIDERS = ("anthropic", "openai", "google")
MILLION = 1_000_000
HEMRA = [sys.executable, "-c", "import sys; from pytest_hemra.cli import main; sys.exit(main())"]


def a_name_of(model: ModelInfo) -> str:
    """A name the model answers to: its id, else what its match logic is built from."""
    if model.is_match(model.id):
        return model.id
    clauses: list[Any] = [model.match]
    while clauses:
        clause = clauses.pop(0)
        if isinstance(clause, ClauseEquals):
            name = clause.equals
        elif isinstance(clause, ClauseStartsWith):
            name = clause.starts_with + "0-example"
        elif isinstance(clause, ClauseOr | ClauseAnd):
            clauses += clause.or_ if isinstance(clause, ClauseOr) else clause.and_
            continue
        elif isinstance(clause, ClauseRegex):
            continue
        else:
            name = model.id
        if model.is_match(name):
            return name
    raise AssertionError(f"no name found for {model.id}")


def dataset_models() -> list[tuple[str, str]]:
    return [
        (provider.id, a_name_of(model))
        for provider in get_snapshot().providers
        if provider.id in MAJOR_PROVIDERS
        for model in provider.models
    ]


def test_every_model_of_the_major_providers_prices_a_million_tokens_in_and_out() -> None:
    found = dataset_models()
    assert {provider for provider, _ in found} == set(MAJOR_PROVIDERS) and len(found) > 150
    table = PriceTable({})
    unpriced = []
    for provider, name in found:
        usage = CallUsage(input_tokens=MILLION, output_tokens=MILLION, model=name)
        if table.cost_of(usage).usd is None:
            unpriced.append(f"{provider}/{name}")
        # the provider's prefix, as a run file or a router may spell the model
        prefixed = CallUsage(
            input_tokens=MILLION, output_tokens=MILLION, model=f"{provider}/{name}"
        )
        assert table.cost_of(prefixed).is_known, f"{provider}/{name}"
    assert unpriced == []


@pytest.mark.parametrize(
    ("model", "usd"),
    [("gpt-5-codex", 1.25 + 10.0), ("claude-3-5-sonnet-20241022", 3.0 + 15.0)],
)
def test_the_models_the_issue_found_unpriced_are_priced(model: str, usd: float) -> None:
    usage = CallUsage(input_tokens=MILLION, output_tokens=MILLION, model=model)
    assert cost_of(usage, PriceTable({})).usd == pytest.approx(usd)


def test_cached_input_is_priced_at_the_datasets_cache_rates() -> None:
    """HEMRA's input tokens exclude cached input; the dataset's include it: each cached token is
    priced once, at its cache rate."""
    table = PriceTable({})
    openai = CallUsage(MILLION, MILLION, MILLION, 0, model="gpt-4.1")  # 2.0, 8.0, 0.5 cached
    assert table.cost_of(openai).usd == pytest.approx(2.0 + 8.0 + 0.5)
    # 3.0 input, 15.0 output, 0.3 cache read, 3.75 cache write (5 minutes)
    anthropic = CallUsage(MILLION // 10, 0, MILLION // 10, MILLION // 10, model="claude-3-5-sonnet")
    assert table.cost_of(anthropic).usd == pytest.approx((3.0 + 0.3 + 3.75) / 10)


def test_a_long_input_is_priced_at_the_dearer_tier() -> None:
    """claude-sonnet-4-5 doubles its input rate past 200k input tokens, cached ones counted."""
    table = PriceTable({})
    short = table.cost_of(CallUsage(100_000, 0, 0, 0, model="claude-sonnet-4-5")).usd
    long = table.cost_of(CallUsage(100_000, 0, 150_000, 0, model="claude-sonnet-4-5")).usd
    assert short == pytest.approx(0.3)
    assert long == pytest.approx((100_000 * 6.0 + 150_000 * 0.6) / MILLION)


def test_the_scripted_model_is_free_and_a_model_nobody_prices_is_unknown() -> None:
    table = PriceTable({})
    assert table.cost_of(CallUsage(MILLION, MILLION, model="hemra/scripted")).usd == 0.0
    unknown = table.cost_of(CallUsage(MILLION, MILLION, model="acme-coder-7"))
    assert unknown.usd is None and not unknown.is_known
    assert table.price_of("acme-coder-7") is None


def test_a_run_files_price_wins_over_the_dataset_and_adds_a_model() -> None:
    table = PriceTable(
        {
            "gpt-4.1": PriceOverride(input=1.0, output=2.0, cache_read=0.1),
            "acme-coder-7": PriceOverride(input=0.5, output=0.5),
        }
    )
    dated = CallUsage(MILLION, MILLION, MILLION, 0, model="openai/gpt-4.1-2025-04-14")
    assert table.cost_of(dated).usd == pytest.approx(1.0 + 2.0 + 0.1)
    # cache rates not given are the input's
    added = CallUsage(MILLION, MILLION, MILLION, MILLION, model="acme-coder-7")
    assert table.cost_of(added).usd == pytest.approx(2.0)


def test_the_run_being_worked_sets_the_prices_every_call_is_costed_at() -> None:
    usage = CallUsage(MILLION, 0, model="gpt-4.1")
    try:
        use_run_prices({"gpt-4.1": PriceOverride(input=7.0, output=7.0)})
        assert cost_of(usage).usd == pytest.approx(7.0)
        assert price_table().price_of("gpt-4.1") is not None
    finally:
        use_run_prices({})
    assert cost_of(usage).usd == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('[prices."gpt-5"]\ninput = -1.0\noutput = 10.0', "prices.gpt-5.input"),
        ('[prices."gpt-5"]\ninput = 1.0\noutput = "ten"', "prices.gpt-5.output"),
        ('[prices."gpt-5"]\ninput = 1.0', "prices.gpt-5.output"),
        ('[prices."gpt-5"]\ninput = 1.0\noutput = 2.0\ncached = 0.1', "prices.gpt-5.cached"),
        ('[prices."gpt-5"]\ninput = nan\noutput = 2.0', "prices.gpt-5.input"),
    ],
)
def test_a_bad_price_in_the_run_file_is_refused_naming_the_file_and_key(
    table: str, key: str, tmp_path: Path
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'harnesses = ["oracle"]\ndatasets = ["hemra-offline"]\n{table}\n')
    with pytest.raises(SpecError) as refused:
        load_run_spec(run_file, Overrides())
    assert str(run_file) in str(refused.value) and f"'{key}'" in str(refused.value)


def test_pricing_makes_no_network_call() -> None:
    """Importing the dataset and pricing with it opens no socket and resolves no name."""
    probe = (
        "import sys\n"
        "seen = []\n"
        "sys.addaudithook(lambda event, args: seen.append(event)"
        " if event.startswith('socket.') else None)\n"
        "from pytest_hemra.execute.gateway.prices import PriceTable\n"
        "from pytest_hemra.execute.gateway.wire import CallUsage\n"
        "table = PriceTable({})\n"
        "for model in ('gpt-5-codex', 'claude-sonnet-4-5', 'gemini-2.5-pro', 'acme-coder-7'):\n"
        "    table.cost_of(CallUsage(1000, 1000, model=model))\n"
        "print(seen)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_model_without_a_price_is_flagged_by_name_under_the_table(tmp_path: Path) -> None:
    """A store written as a run writes it: one harness called a model no one prices."""
    store = Store(tmp_path / "s.db")
    plan = {
        "spec": {"harnesses": ["priced", "unpriced"], "baseline": "priced", "attempts": 1},
        "prices": f"genai-prices {dataset_version()}",
        "datasets": {"ds": {"digest": "d" * 64, "path": "/ds", "tasks": ["a", "b"]}},
        "harnesses": {h: {"digest": h[0] * 64} for h in ("priced", "unpriced")},
    }
    planned = [PlannedTrial("ds", t, h, 1) for t in ("a", "b") for h in ("priced", "unpriced")]
    store.record_plan("r1", "r1", plan, tmp_path, planned)
    for trial in store.trials("r1"):
        is_priced = trial.harness == "priced"
        usage = {
            "calls": 2, "input_tokens": 100, "output_tokens": 50,
            "cost": 0.01 if is_priced else None,
            "models": ["gpt-4.1"] if is_priced else ["gpt-4.1", "acme-coder-7"],
        }  # fmt: skip
        passed = {"outcome": "pass", "reward": 1.0, "rewards": {"reward": 1.0}, "exit_code": 0}
        passed |= {"error": None, "finished_at": 1.0, "duration": 1.0, "phases": {}}
        store.finish_trial(trial.id, trial_result({**passed, "trial_dir": "x", "usage": usage}))
    report = build_report(store, "r1")
    text = render(report, "text")
    assert (
        "! model acme-coder-7 has no price: its cost is unknown, and so is the cost of unpriced"
        ' (a run file\'s [prices."acme-coder-7"] sets one)'
    ) in text
    assert "gpt-4.1 has no price" not in text  # the priced model the same rows called
    assert text.splitlines()[-1] == f"prices: genai-prices {dataset_version()}"
    exported = json.loads(render(report, "json"))
    assert exported["prices"] == f"genai-prices {dataset_version()}"
    flags = exported["datasets"][0]["flags"]
    assert [f["message"].split(":")[0] for f in flags if f["kind"] == "unknown_price"] == [
        "model acme-coder-7 has no price"
    ]


def test_a_run_files_prices_cost_its_calls_and_are_named_in_its_report(tmp_path: Path) -> None:
    """examples/scripted-agent/prices.toml prices the (free) scripted model: the calls cost what
    its rates say, the report's cost column is theirs, and it names the run file's prices."""
    env = {k: v for k, v in os.environ.items() if k != "HEMRA_STORE"}
    run_file = REPO / "examples" / "scripted-agent" / "prices.toml"
    done = subprocess.run(
        [*HEMRA, "run", str(run_file)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with sqlite3.connect(tmp_path / ".hemra" / "hemra.db") as db:
        calls = db.execute(
            "SELECT input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost"
            " FROM calls"
        ).fetchall()
    assert calls and all(cost is not None for *_, cost in calls)
    for tokens_in, tokens_out, read, write, cost in calls:
        expected = (tokens_in * 3.0 + tokens_out * 15.0 + read * 0.3 + write * 3.75) / MILLION
        assert cost == pytest.approx(expected)
    assert sum(cost for *_, cost in calls) > 0
    shown = subprocess.run(
        [*HEMRA, "report", "--format", "json"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=120, check=True,
    )  # fmt: skip
    report = json.loads(shown.stdout)
    source = f"genai-prices {dataset_version()}; run file for hemra/scripted, my-finetune"
    assert report["prices"] == source
    costs = {row["harness"]: row["cost"]["total"] for row in report["datasets"][0]["harnesses"]}
    assert costs["mini-agent"] == pytest.approx(sum(cost for *_, cost in calls), rel=1e-3)
    assert f"prices: {source}" in done.stdout
