"""The store's tables, indexes and schema version, and how rows become records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pytest_hemra.core.lifecycle import TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import (
    TrialFilter,
    TrialRecord,
)

SCHEMA_VERSION = 12
OLDEST_MIGRATED = 2  # stores from schema 2 on are brought forward when opened
EMPTY_USAGE: dict[str, Any] = {
    "calls": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    "cache_read_tokens": 0,
    "cache_write_tokens": 0,
    "cost": 0.0,
    "usage_unknown": 0,
    "models": [],
}

SCHEMA: dict[str, tuple[dict[str, type], str]] = {
    "meta": ({"key": str, "value": str}, "key"),
    "runs": (
        {
            "id": str,
            "name": str,
            "created_at": float,
            "status": str,
            "spec": str,
            "trials_dir": str,
            "schema_version": int,
        },
        "id",
    ),
    "trials": (
        {
            "id": str,
            "run_id": str,
            "seq": int,
            "plan_seq": int,
            "item_id": str,
            "dataset": str,
            "task": str,
            "harness": str,
            "attempt": int,
            "replaces": str,
            "retries": int,
            "status": str,
            "outcome": str,
            "reward": float,
            "rewards": str,
            "exit_code": int,
            "error": str,
            "started_at": float,
            "finished_at": float,
            "duration": float,
            "phases": str,
            "trial_dir": str,
            "worker": str,
            "calls": int,
            "input_tokens": int,
            "output_tokens": int,
            "cache_read_tokens": int,
            "cache_write_tokens": int,
            "cost": float,
            "cost_known": int,  # 0: a call whose usage was read has no price
            "usage_unknown": int,  # calls whose usage could not be read: the cost is unknown
            "models": str,
            "other_model_tokens": int,
            "stopped_by": str,
            "own_report": str,
            "judges": str,
            "error_class": str,  # the SWE track's class (`swe_class`)
            "engine": str,
            "agent_user": str,
            "model": str,  # a matrix run's cell model (NULL: the run's one model)
            "kept_processes": int,  # 1: verified with the agent's processes running
            "cause": str,  # why it ended so beside its outcome (`Cause`); in error_class before 12
        },
        "id",
    ),
    "jobs": (
        {
            "id": str,
            "run_id": str,
            "trial_id": str,
            "state": str,
            "lease_owner": str,
            "lease_expires": float,
            "heartbeat_at": float,
            "created_at": float,
        },
        "id",
    ),
    "calls": (
        {
            "id": int,
            "run_id": str,
            "trial_id": str,
            "at": float,
            "provider": str,
            "wire": str,
            "method": str,
            "path": str,
            "model_requested": str,
            "model": str,
            "status": int,
            "input_tokens": int,
            "output_tokens": int,
            "cache_read_tokens": int,
            "cache_write_tokens": int,
            "cost": float,
            "latency": float,
            "ttfb": float,
            "request_bytes": int,
            "response_bytes": int,
            "error": str,
            "refused": int,
            "headers": str,
            "role": str,
        },
        "id",
    ),
    "calibrations": (
        {
            "id": int,
            "at": float,
            "judge": str,
            "model": str,
            "rubric_digest": str,
            "mae": float,
            "anchors": int,
            "threshold": float,
            "reliable": int,
        },
        "id",
    ),
    "steps": (
        {
            "id": int,
            "run_id": str,
            "trial_id": str,
            "seq": int,
            "name": str,
            "reward": float,
            "rewards": str,
            "exit_code": int,
            "timed_out": int,
            "duration": float,
            "error": str,
        },
        "id",
    ),
    "judgments": (
        {
            "id": int,
            "run_id": str,
            "trial_id": str,
            "judge": str,
            "score": float,
            "rationale": str,
            "error": str,
            "calls": int,
            "input_tokens": int,
            "output_tokens": int,
            "cost": float,
            "cost_known": int,
            "duration": float,
        },
        "id",
    ),
    "placements": (
        {
            "trial_id": str,
            "run_id": str,
            "engine": str,
            "address": str,
            "owner": str,
            "at": float,
        },
        "trial_id",
    ),
    "events": (
        {"id": int, "run_id": str, "trial_id": str, "at": float, "kind": str, "data": str},
        "id",
    ),
    # jobs a harness kind runs for several trials at once (Harbor's), and their claimed results
    "shared_jobs": (
        {
            "id": str,
            "run_id": str,
            "kind": str,
            "name": str,
            "seq": int,
            "data": str,
            "updated_at": float,
        },
        "id",
    ),
    "shared_claims": (
        {"id": str, "run_id": str, "kind": str, "result": str, "trial_id": str, "at": float},
        "id",
    ),
    # who holds a run's board of one kind while it starts, watches or stops shared jobs
    "shared_locks": ({"id": str, "owner": str, "expires_at": float}, "id"),
}
INDEXES = (
    ("trials", ["run_id", "plan_seq", "seq"]),
    ("jobs", ["run_id", "state"]),
    ("calls", ["trial_id"]),
    ("trials", ["run_id", "status", "outcome"]),  # progress counts, read on every viewer poll
    ("shared_jobs", ["run_id", "kind", "seq"]),
    ("shared_claims", ["run_id", "kind"]),
    ("events", ["kind", "trial_id"]),  # trials waiting for an engine, read on every viewer poll
)
# A trial row's status. `replaced`: a retry or a resume ran it again under a new row (`replaces`).
CURRENT = f"status != '{TrialStatus.REPLACED}'"
TRIAL_COLUMNS = (
    "id, run_id, seq, item_id, dataset, task, harness, attempt, status, outcome,"
    " reward, rewards, error, duration, trial_dir,"
    " coalesce(input_tokens, 0) + coalesce(output_tokens, 0)"
    " + coalesce(cache_read_tokens, 0) + coalesce(cache_write_tokens, 0),"
    " CASE WHEN cost_known = 0 OR usage_unknown > 0 THEN NULL ELSE coalesce(cost, 0) END,"
    " models, coalesce(other_model_tokens, 0), stopped_by, own_report, replaces,"
    " coalesce(retries, 0), exit_code, judges, error_class, engine, agent_user,"
    " coalesce(calls, 0), coalesce(usage_unknown, 0), coalesce(cost_known, 1), model,"
    " coalesce(kept_processes, 0), cause"
)


def filter_clauses(run_id: str, where: TrialFilter) -> tuple[list[str], list[Any]]:
    clauses, args = ["run_id = ?", CURRENT], [run_id]
    for column in ("harness", "task", "dataset"):
        value = getattr(where, column)
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if where.outcome in TrialStatus.WITHOUT_OUTCOME:
        clauses.append("status = ? AND outcome IS NULL")
        args.append(where.outcome)
    elif where.outcome is not None:
        clauses.append("outcome = ?")
        args.append(where.outcome)
    if where.text:
        escaped = "".join("\\" + c if c in "\\%_" else c for c in where.text)
        clauses.append("(item_id LIKE ? ESCAPE '\\' OR coalesce(error, '') LIKE ? ESCAPE '\\')")
        args += [f"%{escaped}%"] * 2
    return clauses, args


def trial_id(run_id: str, seq: int) -> str:
    return f"{run_id}.{seq:05d}"


def trial_record(row: Sequence[Any]) -> TrialRecord:
    return TrialRecord(
        id=row[0],
        run_id=row[1],
        seq=row[2],
        item_id=row[3],
        dataset=row[4],
        task=row[5],
        harness=row[6],
        attempt=row[7],
        status=row[8],
        outcome=None if row[9] is None else Outcome(row[9]),
        reward=row[10],
        rewards=json_column(row[11]) or {},
        error=row[12],
        duration=row[13],
        trial_dir=row[14],
        tokens=row[15],
        cost=row[16],
        models=tuple(json_column(row[17]) or ()),
        other_model_tokens=row[18],
        stopped_by=row[19],
        own_report=json_column(row[20]),
        replaces=row[21],
        retries=row[22],
        exit_code=row[23],
        judges=json_column(row[24]) or {},
        swe_class=row[25],
        engine=row[26],
        agent_user=row[27],
        calls=row[28],
        usage_unknown=row[29],
        is_priced=bool(row[30]),
        model=row[31],
        kept_processes=bool(row[32]),
        cause=row[33],
    )


EMPTY_JSON = frozenset({"", "{}", "[]", "null"})


def json_column(text: str | None) -> Any:
    """A JSON column, with the common empty values read without the parser."""
    return None if text is None or text in EMPTY_JSON else json.loads(text)
