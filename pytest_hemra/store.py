"""The SQLite store (WAL): runs, trials, jobs, calls and events. The only module that speaks SQL.

Every process talks through it: the pytest controller, xdist workers, the CLI. A run, its
resolved spec and every planned trial and job are written in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import sqlite_utils

from pytest_hemra.errors import StoreError
from pytest_hemra.records import CallRow, PlannedTrial, RunRecord, TrialRecord

SCHEMA_VERSION = 2
EMPTY_USAGE: dict[str, Any] = {
    "calls": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    "cache_read_tokens": 0,
    "cache_write_tokens": 0,
    "cost": 0.0,
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
            "item_id": str,
            "dataset": str,
            "task": str,
            "harness": str,
            "attempt": int,
            "replaces": str,
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
            "cost_known": int,
            "models": str,
            "other_model_tokens": int,
            "stopped_by": str,
            "own_report": str,
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
        },
        "id",
    ),
    "events": (
        {"id": int, "run_id": str, "trial_id": str, "at": float, "kind": str, "data": str},
        "id",
    ),
}
INDEXES = (("trials", ["run_id", "seq"]), ("jobs", ["run_id", "state"]), ("calls", ["trial_id"]))


class Store:
    """A handle on one store file; cheap to open, one per process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path, timeout=30.0, check_same_thread=False)
        self.db = sqlite_utils.Database(connection)
        self.db.enable_wal()
        self._create_schema()

    def _create_schema(self) -> None:
        with self.db.conn:
            for name, (columns, pk) in SCHEMA.items():
                self.db.table(name).create(columns, pk=pk, if_not_exists=True)
            for table, indexed in INDEXES:
                self.db.table(table).create_index(indexed, if_not_exists=True)
            self.db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                [str(SCHEMA_VERSION)],
            )
        found = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if found is None or int(found[0]) != SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: store schema {found and found[0]}, expected {SCHEMA_VERSION}"
            )

    def close(self) -> None:
        self.db.conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        connection = self.db.conn
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
        except BaseException:
            connection.rollback()
            raise
        connection.commit()

    def record_plan(
        self,
        run_id: str,
        name: str,
        spec: dict[str, Any],
        trials_dir: Path,
        trials: Sequence[PlannedTrial],
    ) -> None:
        """Write the run, its resolved spec, every trial and its job, all or nothing."""
        now = time.time()
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO runs (id, name, created_at, status, spec, trials_dir, schema_version)"
                " VALUES (?, ?, ?, 'recorded', ?, ?, ?)",
                [
                    run_id,
                    name,
                    now,
                    json.dumps(spec, sort_keys=True),
                    str(trials_dir),
                    SCHEMA_VERSION,
                ],
            )
            tx.executemany(
                "INSERT INTO trials (id, run_id, seq, item_id, dataset, task, harness, attempt,"
                " status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'planned')",
                [
                    (
                        trial_id(run_id, seq),
                        run_id,
                        seq,
                        t.item_id,
                        t.dataset,
                        t.task,
                        t.harness,
                        t.attempt,
                    )
                    for seq, t in enumerate(trials)
                ],
            )
            tx.executemany(
                "INSERT INTO jobs (id, run_id, trial_id, state, created_at)"
                " VALUES (?, ?, ?, 'queued', ?)",
                [
                    (trial_id(run_id, seq), run_id, trial_id(run_id, seq), now)
                    for seq in range(len(trials))
                ],
            )
            self._event(tx, run_id, None, "recorded", {"trials": len(trials)})

    def run(self, run_id: str) -> RunRecord:
        row = self.db.execute(
            "SELECT id, name, created_at, status, spec, trials_dir FROM runs WHERE id = ?",
            [run_id],
        ).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no run {run_id!r}")
        return RunRecord(row[0], row[1], row[2], row[3], json.loads(row[4]), Path(row[5]))

    def runs(self) -> list[RunRecord]:
        ids = [r[0] for r in self.db.execute("SELECT id FROM runs ORDER BY created_at")]
        return [self.run(run_id) for run_id in ids]

    def trials(self, run_id: str) -> list[TrialRecord]:
        rows = self.db.execute(
            "SELECT id, run_id, seq, item_id, dataset, task, harness, attempt, status, outcome,"
            " reward, rewards, error, duration, trial_dir,"
            " coalesce(input_tokens, 0) + coalesce(output_tokens, 0)"
            " + coalesce(cache_read_tokens, 0) + coalesce(cache_write_tokens, 0),"
            " CASE WHEN cost_known = 0 THEN NULL ELSE coalesce(cost, 0) END, models,"
            " coalesce(other_model_tokens, 0), stopped_by, own_report"
            " FROM trials WHERE run_id = ?"
            " ORDER BY seq",
            [run_id],
        ).fetchall()
        return [
            TrialRecord(
                id=row[0],
                run_id=row[1],
                seq=row[2],
                item_id=row[3],
                dataset=row[4],
                task=row[5],
                harness=row[6],
                attempt=row[7],
                status=row[8],
                outcome=row[9],
                reward=row[10],
                rewards=json.loads(row[11]) if row[11] else {},
                error=row[12],
                duration=row[13],
                trial_dir=row[14],
                tokens=row[15],
                cost=row[16],
                models=tuple(json.loads(row[17])) if row[17] else (),
                other_model_tokens=row[18],
                stopped_by=row[19],
                own_report=json.loads(row[20]) if row[20] else None,
            )
            for row in rows
        ]

    def start_trial(self, trial: str, worker: str) -> None:
        now = time.time()
        with self._transaction() as tx:
            tx.execute(
                "UPDATE trials SET status = 'running', started_at = ?, worker = ? WHERE id = ?",
                [now, worker, trial],
            )
            tx.execute(
                "UPDATE jobs SET state = 'leased', lease_owner = ?, heartbeat_at = ? WHERE id = ?",
                [worker, now, trial],
            )
            tx.execute(
                "UPDATE runs SET status = 'running' WHERE id = "
                "(SELECT run_id FROM trials WHERE id = ?)",
                [trial],
            )

    def finish_trial(self, trial: str, result: dict[str, Any]) -> None:
        """Store a trial's result and close its job, before pytest reports the item."""
        usage = result.get("usage") or EMPTY_USAGE
        with self._transaction() as tx:
            tx.execute(
                "UPDATE trials SET status = 'finished', outcome = ?, reward = ?, rewards = ?,"
                " exit_code = ?, error = ?, finished_at = ?, duration = ?, phases = ?,"
                " trial_dir = ?, calls = ?, input_tokens = ?, output_tokens = ?,"
                " cache_read_tokens = ?, cache_write_tokens = ?, cost = ?, cost_known = ?,"
                " models = ?, other_model_tokens = ?, stopped_by = ?, own_report = ? WHERE id = ?",
                [
                    result["outcome"],
                    result["reward"],
                    json.dumps(result["rewards"]),
                    result["exit_code"],
                    result["error"],
                    result["finished_at"],
                    result["duration"],
                    json.dumps(result["phases"]),
                    result["trial_dir"],
                    usage["calls"],
                    usage["input_tokens"],
                    usage["output_tokens"],
                    usage["cache_read_tokens"],
                    usage["cache_write_tokens"],
                    usage["cost"],
                    int(usage["cost"] is not None),
                    json.dumps(usage["models"]),
                    usage.get("other_model_tokens", 0),
                    usage.get("stopped_by"),
                    json.dumps(result.get("own_report")),
                    trial,
                ],
            )
            tx.execute("UPDATE jobs SET state = 'done', lease_owner = NULL WHERE id = ?", [trial])
            run_id = tx.execute("SELECT run_id FROM trials WHERE id = ?", [trial]).fetchone()[0]
            self._event(tx, run_id, trial, "finished", {"outcome": result["outcome"]})
            tx.execute(
                "UPDATE runs SET status = 'finished' WHERE id = ? AND NOT EXISTS"
                " (SELECT 1 FROM trials WHERE run_id = ? AND status IN ('planned', 'running'))",
                [run_id, run_id],
            )

    def deselect_trials(self, run_id: str, item_ids: Sequence[str]) -> None:
        """Trials left out by pytest's -k or -m: never run in this session, never scored."""
        with self._transaction() as tx:
            tx.executemany(
                "UPDATE trials SET status = 'deselected' WHERE run_id = ? AND item_id = ?"
                " AND status = 'planned'",
                [(run_id, item) for item in item_ids],
            )
            tx.executemany(
                "UPDATE jobs SET state = 'deselected' WHERE trial_id ="
                " (SELECT id FROM trials WHERE run_id = ? AND item_id = ?) AND state = 'queued'",
                [(run_id, item) for item in item_ids],
            )

    def _event(
        self,
        tx: sqlite3.Connection,
        run_id: str,
        trial: str | None,
        kind: str,
        data: dict[str, Any],
    ) -> None:
        tx.execute(
            "INSERT INTO events (run_id, trial_id, at, kind, data) VALUES (?, ?, ?, ?, ?)",
            [run_id, trial, time.time(), kind, json.dumps(data)],
        )

    def record_call(self, call: CallRow) -> None:
        """One model call, written as it completes (by the gateway's writer thread)."""
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO calls (run_id, trial_id, at, provider, wire, method, path,"
                " model_requested, model, status, input_tokens, output_tokens,"
                " cache_read_tokens, cache_write_tokens, cost, latency, ttfb, request_bytes,"
                " response_bytes, error, refused, headers)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    call.run_id,
                    call.trial_id,
                    call.at,
                    call.provider,
                    call.wire,
                    call.method,
                    call.path,
                    call.model_requested,
                    call.model,
                    call.status,
                    call.input_tokens,
                    call.output_tokens,
                    call.cache_read_tokens,
                    call.cache_write_tokens,
                    call.cost,
                    call.latency,
                    call.ttfb,
                    call.request_bytes,
                    call.response_bytes,
                    call.error,
                    int(call.refused),
                    json.dumps(call.headers, sort_keys=True),
                ],
            )

    def calls(self, trial: str | None = None, run_id: str | None = None) -> list[CallRow]:
        where, args = ("trial_id = ?", [trial]) if trial else ("run_id = ?", [run_id])
        if trial is None and run_id is None:
            where, args = ("1", [])
        rows = self.db.execute(
            "SELECT run_id, trial_id, at, provider, wire, method, path, model_requested, model,"
            " status, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost,"
            " latency, ttfb, request_bytes, response_bytes, error, refused, headers"
            f" FROM calls WHERE {where} ORDER BY id",
            args,
        ).fetchall()
        names = [f.name for f in fields(CallRow)]
        return [
            CallRow(
                **dict(zip(names[:20], row[:20], strict=True)),
                refused=bool(row[20]),
                headers=json.loads(row[21]),
            )
            for row in rows
        ]

    def run_cost(self, run_id: str) -> float:
        """What a run's calls have cost so far (calls of unknown price count as 0)."""
        found = self.db.execute(
            "SELECT coalesce(sum(cost), 0) FROM calls WHERE run_id = ?", [run_id]
        ).fetchone()
        return float(found[0])

    def count(self, table: str) -> int:
        if table not in SCHEMA:
            raise StoreError(f"{self.path}: no table {table!r}")
        return int(self.db.execute(f"SELECT count(*) FROM [{table}]").fetchone()[0])


def trial_id(run_id: str, seq: int) -> str:
    return f"{run_id}.{seq:05d}"
