"""The core's shared names: outcomes and their groups, token usage, the stored plan's reader."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.stored import StoredPlan
from pytest_hemra.core.usage import Usage, disagrees
from pytest_hemra.core.words import plural


def test_outcomes_are_their_stored_strings() -> None:
    assert [str(o) for o in Outcome] == [
        "pass", "fail", "timeout", "harness_error", "tampered", "verifier_error", "infra_error",
        "cancelled",
    ]  # fmt: skip
    assert Outcome("harness_error") is Outcome.HARNESS_ERROR
    stored: str = "pass"
    assert stored == Outcome.PASS and f"{Outcome.INFRA_ERROR}" == "infra_error"
    assert json.dumps({"outcome": Outcome.TIMEOUT}) == '{"outcome": "timeout"}'


def test_outcome_groups_follow_the_design_table() -> None:
    scored = {"pass", "fail", "timeout", "harness_error", "tampered", "verifier_error"}
    assert scored == Outcome.SCORED
    assert {"fail", "timeout", "harness_error", "tampered", "verifier_error"} == Outcome.FAILED
    assert {"infra_error"} == Outcome.ERROR
    assert {"verifier_error", "infra_error", "cancelled"} == Outcome.UNFINISHED
    assert set(Outcome) == Outcome.SCORED | Outcome.UNFINISHED  # every outcome is one or other
    # a trial the verifier could not score is the agent's: scored 0, and still said unfinished
    assert {"verifier_error"} == Outcome.SCORED & Outcome.UNFINISHED
    assert Outcome.PASS not in Outcome.FAILED and Outcome.CANCELLED not in Outcome.ERROR
    assert Outcome.TIMEOUT.is_scored and not Outcome.CANCELLED.is_scored
    assert "fail" in Outcome.SCORED and None not in Outcome.SCORED  # plain stored values


def test_outcome_groups_are_served_as_lists_of_strings() -> None:
    groups = Outcome.groups()
    assert groups["outcomes"] == [str(o) for o in Outcome]
    assert groups["failed"][-2:] == ["tampered", "verifier_error"]  # in the outcomes' order
    assert set(groups) == {"outcomes", "scored", "failed", "error", "unfinished"}


def test_usage_totals_adds_and_reads_stored_counts() -> None:
    usage = Usage(100, 50, 20, 10)
    assert usage.total_tokens == 180
    assert usage + Usage(1, 2, 3, 4) == Usage(101, 52, 23, 14)
    assert usage.counts() == {
        "input_tokens": 100, "output_tokens": 50, "cache_read_tokens": 20, "cache_write_tokens": 10,
    }  # fmt: skip
    assert Usage.of({"input_tokens": 7, "cache_write_tokens": None, "cost_usd": 0.1}) == Usage(7)
    assert list(asdict(usage)) == ["input_tokens", "output_tokens", "cache_read_tokens",
                                   "cache_write_tokens"]  # fmt: skip


@pytest.mark.parametrize(
    ("own", "gateway", "expected"),
    [(100, 100, False), (104, 100, False), (110, 100, True), (0, 0, False), (0, 5, True)],
)
def test_own_token_count_disagrees_past_five_percent(
    own: int, gateway: int, expected: bool
) -> None:
    assert disagrees(own, gateway) is expected


def recorded(**more: Any) -> dict[str, Any]:
    """What `Plan.record()` writes, trimmed to a run of two harnesses on one dataset."""
    return {
        "schema_version": 1,
        "source": "run.toml",
        "spec": {"harnesses": ["codex", "claude-code"], "baseline": "claude-code",
                 "model": "m-1", "attempts": 3, "timeout_secs": 600.0},
        "harnesses": {
            "codex": {"path": "/h/codex.toml", "digest": "c" * 64, "spec": {"kind": "cli"}},
            "claude-code": {"path": "/h/cc.toml", "digest": "a" * 64, "spec": {"kind": "cli"}},
        },
        "datasets": {"ds": {"path": "/ds", "digest": "d" * 64, "tasks": ["t1", "t2"]}},
        "judges": [{"name": "j", "rubric": "Score it.", "model": "m-2", "command": None},
                   {"name": "p", "rubric": "", "model": None, "command": ["python", "j.py"]}],
        **more,
    }  # fmt: skip


def test_stored_plan_reads_what_the_plan_recorded() -> None:
    plan = StoredPlan.read(recorded())
    assert (plan.schema_version, plan.source) == (1, "run.toml")
    assert plan.harness_names == ("codex", "claude-code")
    assert plan.baseline == "claude-code"
    assert plan.ordered_harnesses == ["claude-code", "codex"]
    assert (plan.model, plan.attempts, plan.timeout_secs) == ("m-1", 3, 600.0)
    assert plan.harnesses["codex"].digest == "c" * 64 and plan.harnesses["codex"].kind == "cli"
    assert plan.harnesses["codex"].settings == {"kind": "cli"}
    dataset = plan.datasets["ds"]
    assert (dataset.path, dataset.digest, dataset.tasks) == ("/ds", "d" * 64, ("t1", "t2"))
    judge, program = plan.judges
    assert (judge.name, judge.model, judge.command) == ("j", "m-2", None)
    assert len(judge.rubric_digest) == 64
    assert (program.model, program.command) == (None, ("python", "j.py"))
    assert plan.unmetered == frozenset()


def test_stored_plan_baseline_defaults_to_the_first_harness() -> None:
    record = recorded()
    del record["spec"]["baseline"]
    plan = StoredPlan.read(record)
    assert plan.baseline == "codex" and plan.ordered_harnesses == ["codex", "claude-code"]


def test_a_harness_is_metered_unless_recorded_otherwise_or_harbor() -> None:
    record = recorded()
    record["harnesses"]["codex"]["spec"]["kind"] = "harbor"
    assert StoredPlan.read(record).unmetered == {"codex"}
    record["harnesses"]["codex"]["metered"] = True  # what its kind recorded wins
    record["harnesses"]["claude-code"]["metered"] = False
    assert StoredPlan.read(record).unmetered == {"claude-code"}


def test_a_partial_or_empty_record_reads_as_defaults() -> None:
    plan = StoredPlan.read({})
    assert (plan.schema_version, plan.baseline, plan.model, plan.attempts) == (None,) * 4
    assert (plan.harness_names, plan.judges, dict(plan.datasets)) == ((), (), {})
    partial = StoredPlan.read({"spec": {"harnesses": ["h"]}, "harnesses": {"h": {"digest": "x"}}})
    assert partial.baseline == "h" and partial.harnesses["h"].path is None
    assert partial.harnesses["h"].metered


def test_a_count_reads_with_its_noun_in_the_number_it_has() -> None:
    assert [plural(n, "task") for n in (0, 1, 2)] == ["0 tasks", "1 task", "2 tasks"]
    assert plural(1, "sandbox", "sandboxes") == "1 sandbox"
    assert plural(3, "sandbox", "sandboxes") == "3 sandboxes"
    assert plural(1200, "trial") == "1,200 trials"
