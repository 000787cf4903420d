"""The SQLite store (WAL): runs, trials, jobs, calls and events. The only module that speaks SQL.

Every process talks through it: the pytest controller, xdist workers, the CLI. A run, its
resolved spec and every planned trial and job are written in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import sqlite_utils

from pytest_hemra.errors import StoreError
from pytest_hemra.records import (
    CallRow,
    EngineSlot,
    PlannedTrial,
    RunRecord,
    TrialCounts,
    TrialDetail,
    TrialFilter,
    TrialRecord,
)

SCHEMA_VERSION = 6
OLDEST_MIGRATED = 2  # stores from schema 2 on are brought forward when opened
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
            "cost_known": int,
            "models": str,
            "other_model_tokens": int,
            "stopped_by": str,
            "own_report": str,
            "judges": str,
            "error_class": str,
            "engine": str,
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
}
INDEXES = (
    ("trials", ["run_id", "plan_seq", "seq"]),
    ("jobs", ["run_id", "state"]),
    ("calls", ["trial_id"]),
    ("trials", ["run_id", "status", "outcome"]),  # progress counts, read on every viewer poll
)
# A trial row's status. `replaced`: a retry or a resume ran it again under a new row (`replaces`).
CURRENT = "status != 'replaced'"
UNFINISHED = ("planned", "running")
TRIAL_COLUMNS = (
    "id, run_id, seq, item_id, dataset, task, harness, attempt, status, outcome,"
    " reward, rewards, error, duration, trial_dir,"
    " coalesce(input_tokens, 0) + coalesce(output_tokens, 0)"
    " + coalesce(cache_read_tokens, 0) + coalesce(cache_write_tokens, 0),"
    " CASE WHEN cost_known = 0 THEN NULL ELSE coalesce(cost, 0) END, models,"
    " coalesce(other_model_tokens, 0), stopped_by, own_report, replaces, coalesce(retries, 0),"
    " exit_code, judges, error_class, engine"
)


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
        """Create the tables once, in a write transaction taken up front: a reader that
        upgraded to a writer while runners write would fail at once with 'database is locked'."""
        found = self._schema_version()
        if found is None:
            with self._transaction():
                for name, (columns, pk) in SCHEMA.items():
                    self.db.table(name).create(columns, pk=pk, if_not_exists=True)
                for table, indexed in INDEXES:
                    self.db.table(table).create_index(indexed, if_not_exists=True)
                self.db.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                    [str(SCHEMA_VERSION)],
                )
            found = self._schema_version()
        if found is not None and found.isdigit() and OLDEST_MIGRATED <= int(found) < SCHEMA_VERSION:
            self._migrate(int(found))
            found = self._schema_version()
        if found != str(SCHEMA_VERSION):
            raise StoreError(f"{self.path}: store schema {found}, expected {SCHEMA_VERSION}")
        self._add_missing_indexes()

    def _migrate(self, found: int) -> None:
        """Bring an older store forward in place: every change since schema 2 adds tables and
        columns (nothing is dropped or renamed), so old runs stay readable and resumable."""
        with self._transaction() as tx:
            for name, (columns, pk) in SCHEMA.items():
                table = self.db.table(name)
                if not table.exists():
                    table.create(columns, pk=pk)
                    continue
                present = {column.name for column in table.columns}
                for column, kind in columns.items():
                    if column not in present:
                        table.add_column(column, kind)
            tx.execute("UPDATE trials SET plan_seq = seq WHERE plan_seq IS NULL")
            tx.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)]
            )
            self._event_any(tx, "migrated", {"from": found, "to": SCHEMA_VERSION})

    def _add_missing_indexes(self) -> None:
        """Indexes added to INDEXES after a store was made are created once, on its next open;
        a store that has them all is only read."""
        names = {row[0] for row in self.db.execute("SELECT name FROM sqlite_master")}
        missing = [(t, c) for t, c in INDEXES if f"idx_{t}_{'_'.join(c)}" not in names]
        if missing:
            with self._transaction():
                for table, indexed in missing:
                    self.db.table(table).create_index(indexed, if_not_exists=True)

    def _schema_version(self) -> str | None:
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.OperationalError:  # no meta table yet
            return None
        return None if row is None else str(row[0])

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
        status: str = "recorded",
    ) -> None:
        """Write the run, its resolved spec, every trial and its job, all or nothing.

        `status` is `queued` for a detached run, left for `hemra serve` to work."""
        now = time.time()
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO runs (id, name, created_at, status, spec, trials_dir, schema_version)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    run_id,
                    name,
                    now,
                    status,
                    json.dumps(spec, sort_keys=True),
                    str(trials_dir),
                    SCHEMA_VERSION,
                ],
            )
            tx.executemany(
                "INSERT INTO trials (id, run_id, seq, plan_seq, item_id, dataset, task, harness,"
                " attempt, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'planned')",
                [
                    (
                        trial_id(run_id, seq),
                        run_id,
                        seq,
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

    def trials(self, run_id: str, *, history: bool = False) -> list[TrialRecord]:
        """A run's trials in plan order (a retry takes its trial's place); with `history`, also
        the rows retries and resumes replaced."""
        where = "run_id = ?" if history else f"run_id = ? AND {CURRENT}"
        rows = self.db.execute(
            f"SELECT {TRIAL_COLUMNS} FROM trials WHERE {where} ORDER BY plan_seq, seq", [run_id]
        ).fetchall()
        return [_trial_record(row) for row in rows]

    def trial(self, trial: str) -> TrialRecord:
        query = f"SELECT {TRIAL_COLUMNS} FROM trials WHERE id = ?"
        row = self.db.execute(query, [trial]).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no trial {trial!r}")
        return _trial_record(row)

    def trial_page(
        self,
        run_id: str,
        where: TrialFilter,
        *,
        limit: int | None,
        offset: int = 0,
        after: str | None = None,
    ) -> list[TrialRecord]:
        """A page of a run's current trials in plan order, those `where` matches: `limit` rows
        (None: all) from `offset`, or from just after trial `after` (a cursor that stays put
        while trials are added). Walks the (run_id, plan_seq, seq) index, so a page is cheap
        wherever it starts."""
        clauses, args = _filter_clauses(run_id, where)
        if after is not None:
            clauses.append("(plan_seq, seq) > (SELECT plan_seq, seq FROM trials WHERE id = ?)")
            args.append(after)
        rows = self.db.execute(
            f"SELECT {TRIAL_COLUMNS} FROM trials WHERE {' AND '.join(clauses)}"
            " ORDER BY plan_seq, seq LIMIT ? OFFSET ?",
            [*args, -1 if limit is None else limit, offset],
        ).fetchall()
        return [_trial_record(row) for row in rows]

    def count_trials(self, run_id: str, where: TrialFilter) -> int:
        """How many of a run's current trials `where` matches."""
        clauses, args = _filter_clauses(run_id, where)
        query = f"SELECT count(*) FROM trials WHERE {' AND '.join(clauses)}"
        return int(self.db.execute(query, args).fetchone()[0])

    def trial_counts(self, run_id: str | None = None) -> dict[str, TrialCounts]:
        """Each run's trials counted by status and by outcome (one run, or every run), from the
        (run_id, status, outcome) index alone."""
        where, args = ("run_id = ? AND", [run_id]) if run_id is not None else ("", [])
        rows = self.db.execute(
            "SELECT run_id, status, outcome, count(*) FROM trials"
            f" WHERE {where} status != 'replaced' GROUP BY run_id, status, outcome",
            args,
        )
        statuses: dict[str, dict[str, int]] = {}
        outcomes: dict[str, dict[str, int]] = {}
        for run, status, outcome, count in rows:
            mine = statuses.setdefault(run, {})
            mine[status] = mine.get(status, 0) + count
            if outcome is not None:
                theirs = outcomes.setdefault(run, {})
                theirs[outcome] = theirs.get(outcome, 0) + count
        return {run: TrialCounts(statuses[run], outcomes.get(run, {})) for run in statuses}

    def trial_detail(self, trial: str) -> TrialDetail:
        """A trial with its phases, times, worker, token counts and its job's state."""
        row = self.db.execute(
            "SELECT phases, started_at, finished_at, worker, coalesce(calls, 0),"
            " coalesce(input_tokens, 0), coalesce(output_tokens, 0),"
            " coalesce(cache_read_tokens, 0), coalesce(cache_write_tokens, 0),"
            " (SELECT state FROM jobs WHERE jobs.id = trials.id) FROM trials WHERE id = ?",
            [trial],
        ).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no trial {trial!r}")
        return TrialDetail(self.trial(trial), _json(row[0]) or {}, *row[1:])

    def claim(self, trial: str, worker: str, lease_secs: float) -> str:
        """Lease a trial's job to `worker` if it is queued; return the job's state after.

        `leased` by `worker` means it is this worker's to run; anything else (`cancelled`,
        `done`, `leased` by another live runner) means it is not."""
        now = time.time()
        with self._transaction() as tx:
            claimed = tx.execute(
                "UPDATE jobs SET state = 'leased', lease_owner = ?, lease_expires = ?,"
                " heartbeat_at = ? WHERE id = ? AND state = 'queued'",
                [worker, now + lease_secs, now, trial],
            ).rowcount
            if claimed:
                tx.execute(
                    "UPDATE trials SET status = 'running', started_at = ?, worker = ? WHERE id = ?",
                    [now, worker, trial],
                )
                tx.execute(
                    "UPDATE runs SET status = 'running' WHERE id ="
                    " (SELECT run_id FROM trials WHERE id = ?) AND status != 'cancelled'",
                    [trial],
                )
                return "leased"
            found = tx.execute(
                "SELECT state, lease_owner FROM jobs WHERE id = ?", [trial]
            ).fetchone()
        if found is None:
            raise StoreError(f"{self.path}: no job for trial {trial!r}")
        return "taken" if found[0] == "leased" else str(found[0])

    def heartbeat(self, trial: str, worker: str, lease_secs: float) -> str | None:
        """Renew `worker`'s lease on a running trial; return the job's state (`cancelling`
        when `hemra cancel` asked it to stop), None when the lease is no longer this worker's."""
        now = time.time()
        with self._transaction() as tx:
            tx.execute(
                "UPDATE jobs SET lease_expires = ?, heartbeat_at = ?"
                " WHERE id = ? AND lease_owner = ? AND state IN ('leased', 'cancelling')",
                [now + lease_secs, now, trial, worker],
            )
            found = tx.execute(
                "SELECT state FROM jobs WHERE id = ? AND lease_owner = ?", [trial, worker]
            ).fetchone()
        return None if found is None else str(found[0])

    def finish_trial(self, trial: str, result: dict[str, Any]) -> None:
        """Store a trial's result and close its job, before pytest reports the item."""
        usage = result.get("usage") or EMPTY_USAGE
        status = "cancelled" if result["outcome"] == "cancelled" else "finished"
        with self._transaction() as tx:
            tx.execute(
                "UPDATE trials SET status = ?, outcome = ?, reward = ?, rewards = ?,"
                " exit_code = ?, error = ?, finished_at = ?, duration = ?, phases = ?,"
                " trial_dir = ?, calls = ?, input_tokens = ?, output_tokens = ?,"
                " cache_read_tokens = ?, cache_write_tokens = ?, cost = ?, cost_known = ?,"
                " models = ?, other_model_tokens = ?, stopped_by = ?, own_report = ?, judges = ?,"
                " error_class = ? WHERE id = ?",
                [
                    status,
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
                    json.dumps({j["judge"]: j["score"] for j in result.get("judgments") or []}),
                    result.get("error_class"),
                    trial,
                ],
            )
            run_id = tx.execute("SELECT run_id FROM trials WHERE id = ?", [trial]).fetchone()[0]
            tx.executemany(
                "INSERT INTO steps (run_id, trial_id, seq, name, reward, rewards, exit_code,"
                " timed_out, duration, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        trial,
                        seq,
                        step["name"],
                        step["reward"],
                        json.dumps(step["rewards"]),
                        step["exit_code"],
                        int(step["timed_out"]),
                        step["duration"],
                        step["error"],
                    )
                    for seq, step in enumerate(result.get("steps") or [], start=1)
                ],
            )
            tx.executemany(
                "INSERT INTO judgments (run_id, trial_id, judge, score, rationale, error, calls,"
                " input_tokens, output_tokens, cost, cost_known, duration)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        trial,
                        j["judge"],
                        j["score"],
                        j["rationale"],
                        j["error"],
                        j["calls"],
                        j["input_tokens"],
                        j["output_tokens"],
                        j["cost"],
                        int(j["cost"] is not None),
                        j["duration"],
                    )
                    for j in result.get("judgments") or []
                ],
            )
            tx.execute(
                "UPDATE jobs SET state = ?, lease_owner = NULL WHERE id = ?",
                ["cancelled" if status == "cancelled" else "done", trial],
            )
            self._event(tx, run_id, trial, "finished", {"outcome": result["outcome"]})
            self._close_run(tx, run_id)

    def _close_run(self, tx: sqlite3.Connection, run_id: str) -> None:
        """A run with no unfinished trial left is `finished` (or stays `cancelled`)."""
        tx.execute(
            "UPDATE runs SET status = 'finished' WHERE id = ? AND status != 'cancelled'"
            f" AND NOT EXISTS (SELECT 1 FROM trials WHERE run_id = ? AND {CURRENT}"
            " AND status IN ('planned', 'running'))",
            [run_id, run_id],
        )

    def cancel_trials(self, trials: Sequence[str], reason: str) -> int:
        """Record unfinished trials cancelled (never failed); finished ones are left alone."""
        now = time.time()
        cancelled = 0
        with self._transaction() as tx:
            for trial in trials:
                cancelled += tx.execute(
                    "UPDATE trials SET status = 'cancelled', outcome = 'cancelled', error = ?,"
                    " finished_at = ? WHERE id = ? AND status IN ('planned', 'running')",
                    [reason, now, trial],
                ).rowcount
                tx.execute(
                    "UPDATE jobs SET state = 'cancelled', lease_owner = NULL"
                    " WHERE id = ? AND state IN ('queued', 'leased', 'cancelling')",
                    [trial],
                )
            for (run_id,) in tx.execute(
                "SELECT DISTINCT run_id FROM trials WHERE id IN (SELECT value FROM json_each(?))",
                [json.dumps(list(trials))],
            ).fetchall():
                self._close_run(tx, run_id)
        return cancelled

    def cancel_run(self, run_id: str, is_alive: Callable[[str], bool]) -> tuple[int, int]:
        """`hemra cancel`: queued jobs are cancelled now; running ones are asked to stop
        (`cancelling`, seen by their runner's heartbeat), or cancelled now if their runner is
        gone. Returns (cancelled now, asked to stop)."""
        self.run(run_id)
        now = time.time()
        with self._transaction() as tx:
            tx.execute("UPDATE runs SET status = 'cancelled' WHERE id = ?", [run_id])
            leased = tx.execute(
                "SELECT id, lease_owner, lease_expires FROM jobs WHERE run_id = ?"
                " AND state IN ('leased', 'cancelling')",
                [run_id],
            ).fetchall()
            live = [job for job, owner, expires in leased if is_alive(owner) and expires > now]
            tx.executemany(
                "UPDATE jobs SET state = 'cancelling' WHERE id = ?", [(job,) for job in live]
            )
            self._event(tx, run_id, None, "cancel", {"running": len(live)})
        dead = [job for job, *_ in leased if job not in live]
        queued = [
            r[0]
            for r in self.db.execute(
                "SELECT id FROM jobs WHERE run_id = ? AND state = 'queued'", [run_id]
            )
        ]
        return self.cancel_trials(queued + dead, "cancelled by hemra cancel"), len(live)

    def replace_trial(self, trial: str, *, retry: bool) -> TrialRecord:
        """Run a trial again under a new row linked to it (`replaces`): an infrastructure
        retry (`retry`), or a resume of a trial whose runner died or that was cancelled."""
        with self._transaction() as tx:
            old = tx.execute(
                "SELECT run_id, item_id, dataset, task, harness, attempt, coalesce(retries, 0),"
                " plan_seq FROM trials WHERE id = ?",
                [trial],
            ).fetchone()
            if old is None:
                raise StoreError(f"{self.path}: no trial {trial!r}")
            run_id = old[0]
            seq = tx.execute("SELECT max(seq) + 1 FROM trials WHERE run_id = ?", [run_id])
            new_id = trial_id(run_id, seq.fetchone()[0])
            tx.execute("UPDATE trials SET status = 'replaced' WHERE id = ?", [trial])
            tx.execute(
                "UPDATE jobs SET state = 'replaced', lease_owner = NULL WHERE id = ?", [trial]
            )
            tx.execute(
                "INSERT INTO trials (id, run_id, seq, plan_seq, item_id, dataset, task, harness,"
                " attempt, replaces, retries, status)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'planned')",
                [
                    new_id,
                    run_id,
                    int(new_id.rsplit(".", 1)[1]),
                    old[7],
                    *old[1:6],
                    trial,
                    old[6] + int(retry),
                ],
            )
            tx.execute(
                "INSERT INTO jobs (id, run_id, trial_id, state, created_at)"
                " VALUES (?, ?, ?, 'queued', ?)",
                [new_id, run_id, new_id, time.time()],
            )
            tx.execute(
                "UPDATE runs SET status = 'running' WHERE id = ? AND status = 'finished'",
                [run_id],
            )
            self._event(tx, run_id, new_id, "retry" if retry else "resume", {"replaces": trial})
        return self.trial(new_id)

    def claim_engine(
        self,
        trial: str,
        owner: str,
        slots: Sequence[EngineSlot],
        is_alive: Callable[[str], bool],
    ) -> EngineSlot | None:
        """Place a running trial on one of `slots` with a free slot: one that holds the trial's
        image first, then the least loaded (by share of its capacity), then the first listed;
        None when every one is full.

        One write transaction, so runners placing at once never fill an engine past its
        capacity; slots are counted by address across every run of the store. A placement ends
        with `release_engine`, or when its trial's runner is gone (lease expired, process dead).
        """
        now = time.time()
        with self._transaction() as tx:
            held = tx.execute(
                "SELECT p.trial_id, p.owner, j.state, j.lease_expires FROM placements p"
                " LEFT JOIN jobs j ON j.id = p.trial_id"
            ).fetchall()
            gone = [
                (placed,)
                for placed, holder, state, expires in held
                if state not in ("leased", "cancelling")
                or (expires or 0) < now
                or not is_alive(holder)
            ]
            tx.executemany("DELETE FROM placements WHERE trial_id = ?", gone)
            load = {
                address: int(count)
                for address, count in tx.execute(
                    "SELECT address, count(*) FROM placements WHERE trial_id != ? GROUP BY address",
                    [trial],
                )
            }
            free = [slot for slot in slots if load.get(slot.address, 0) < slot.capacity]
            if not free:
                return None
            listed = {slot.address: index for index, slot in enumerate(slots)}
            chosen = min(
                free,
                key=lambda slot: (
                    not slot.has_image,
                    load.get(slot.address, 0) / slot.capacity,
                    listed[slot.address],
                ),
            )
            tx.execute(
                "INSERT OR REPLACE INTO placements (trial_id, run_id, engine, address, owner, at)"
                " VALUES (?, (SELECT run_id FROM trials WHERE id = ?), ?, ?, ?, ?)",
                [trial, trial, chosen.name, chosen.address, owner, now],
            )
            tx.execute("UPDATE trials SET engine = ? WHERE id = ?", [chosen.name, trial])
        return chosen

    def release_engine(self, trial: str) -> None:
        """A trial's engine slot is free again (its sandbox is gone)."""
        with self._transaction() as tx:
            tx.execute("DELETE FROM placements WHERE trial_id = ?", [trial])

    def engine_load(self) -> dict[str, int]:
        """Trials placed on each engine address right now (as the store counts slots)."""
        rows = self.db.execute("SELECT address, count(*) FROM placements GROUP BY address")
        return {address: int(count) for address, count in rows}

    def stale_trials(self, run_id: str, is_alive: Callable[[str], bool]) -> list[str]:
        """Running trials whose runner is gone: its lease expired, or its process is dead."""
        now = time.time()
        rows = self.db.execute(
            "SELECT id, lease_owner, lease_expires FROM jobs WHERE run_id = ?"
            " AND state IN ('leased', 'cancelling')",
            [run_id],
        ).fetchall()
        return [job for job, owner, expires in rows if (expires or 0) < now or not is_alive(owner)]

    def runnable_runs(self, is_alive: Callable[[str], bool]) -> list[str]:
        """Runs `hemra serve` should work: queued jobs, or running ones whose runner is gone."""
        ids = [
            r[0]
            for r in self.db.execute(
                "SELECT id FROM runs WHERE status NOT IN ('cancelled', 'finished')"
                " ORDER BY created_at"
            )
        ]
        return [
            run_id
            for run_id in ids
            if self.db.execute(
                "SELECT 1 FROM jobs WHERE run_id = ? AND state = 'queued' LIMIT 1", [run_id]
            ).fetchone()
            or self.stale_trials(run_id, is_alive)
        ]

    def steps(self, trial: str) -> list[dict[str, Any]]:
        """A multi-step task's steps for one trial, in order: one row per step."""
        rows = self.db.execute(
            "SELECT seq, name, reward, rewards, exit_code, timed_out, duration, error"
            " FROM steps WHERE trial_id = ? ORDER BY seq",
            [trial],
        )
        names = ("seq", "name", "reward", "rewards", "exit_code", "timed_out", "duration", "error")
        found = [dict(zip(names, row, strict=True)) for row in rows]
        for step in found:
            step["rewards"] = _json(step["rewards"]) or {}
        return found

    def judgments(self, trial: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT judge, score, rationale, error, calls, input_tokens, output_tokens, cost,"
            " duration FROM judgments WHERE trial_id = ? ORDER BY id",
            [trial],
        )
        names = (
            "judge",
            "score",
            "rationale",
            "error",
            "calls",
            "input_tokens",
            "output_tokens",
            "cost",
            "duration",
        )
        return [dict(zip(names, row, strict=True)) for row in rows]

    def record_calibration(self, row: dict[str, Any]) -> None:
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO calibrations (at, judge, model, rubric_digest, mae, anchors,"
                " threshold, reliable) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    time.time(),
                    row["judge"],
                    row["model"],
                    row["rubric_digest"],
                    row["mae"],
                    row["anchors"],
                    row["threshold"],
                    row["reliable"],
                ],
            )

    def latest_calibration(self, rubric_digest: str, model: str) -> dict[str, Any] | None:
        """The last calibration of a rubric (by digest) against a model, if any."""
        row = self.db.execute(
            "SELECT judge, mae, anchors, threshold, reliable, at FROM calibrations"
            " WHERE rubric_digest = ? AND model = ? ORDER BY at DESC, id DESC LIMIT 1",
            [rubric_digest, model],
        ).fetchone()
        if row is None:
            return None
        names = ("judge", "mae", "anchors", "threshold", "reliable", "at")
        return dict(zip(names, row, strict=True))

    def job_state(self, trial: str) -> str | None:
        found = self.db.execute("SELECT state FROM jobs WHERE id = ?", [trial]).fetchone()
        return None if found is None else str(found[0])

    def reopen_run(self, run_id: str) -> None:
        """A cancelled run asked to finish after all (`--hemra-resume-cancelled`)."""
        with self._transaction() as tx:
            tx.execute(
                "UPDATE runs SET status = 'running' WHERE id = ? AND status = 'cancelled'",
                [run_id],
            )

    def job_counts(self, run_id: str) -> dict[str, int]:
        rows = self.db.execute(
            "SELECT state, count(*) FROM jobs WHERE run_id = ? GROUP BY state", [run_id]
        )
        return {state: count for state, count in rows}

    def deselect_trials(self, run_id: str, item_ids: Sequence[str]) -> None:
        """Trials left out by pytest's -k or -m: never run in this session, never scored."""
        with self._transaction() as tx:
            tx.executemany(
                "UPDATE trials SET status = 'deselected' WHERE run_id = ? AND item_id = ?"
                " AND status = 'planned'",
                [(run_id, item) for item in item_ids],
            )
            tx.executemany(
                "UPDATE jobs SET state = 'deselected' WHERE trial_id IN"
                " (SELECT id FROM trials WHERE run_id = ? AND item_id = ?"
                " AND status = 'deselected')"
                " AND state = 'queued'",
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

    def _event_any(self, tx: sqlite3.Connection, kind: str, data: dict[str, Any]) -> None:
        """An event of the store itself, not of a run."""
        tx.execute(
            "INSERT INTO events (run_id, trial_id, at, kind, data) VALUES (NULL, NULL, ?, ?, ?)",
            [time.time(), kind, json.dumps(data)],
        )

    def record_call(self, call: CallRow) -> None:
        """One model call, written as it completes (by the gateway's writer thread)."""
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO calls (run_id, trial_id, at, provider, wire, method, path,"
                " model_requested, model, status, input_tokens, output_tokens,"
                " cache_read_tokens, cache_write_tokens, cost, latency, ttfb, request_bytes,"
                " response_bytes, error, refused, headers, role)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    call.role,
                ],
            )

    def calls(self, trial: str | None = None, run_id: str | None = None) -> list[CallRow]:
        where, args = ("trial_id = ?", [trial]) if trial else ("run_id = ?", [run_id])
        if trial is None and run_id is None:
            where, args = ("1", [])
        rows = self.db.execute(
            "SELECT run_id, trial_id, at, provider, wire, method, path, model_requested, model,"
            " status, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost,"
            " latency, ttfb, request_bytes, response_bytes, error, refused, headers,"
            f" coalesce(role, 'agent') FROM calls WHERE {where} ORDER BY id",
            args,
        ).fetchall()
        names = [f.name for f in fields(CallRow)]
        return [
            CallRow(
                **dict(zip(names[:20], row[:20], strict=True)),
                refused=bool(row[20]),
                headers=json.loads(row[21]),
                role=row[22],
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


# A filter on a trial's outcome names its status when it has no outcome yet.
STATUSES_WITHOUT_OUTCOME = frozenset({"planned", "running", "deselected"})


def _filter_clauses(run_id: str, where: TrialFilter) -> tuple[list[str], list[Any]]:
    clauses, args = ["run_id = ?", CURRENT], [run_id]
    for column in ("harness", "task", "dataset"):
        value = getattr(where, column)
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if where.outcome in STATUSES_WITHOUT_OUTCOME:
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


def _trial_record(row: Sequence[Any]) -> TrialRecord:
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
        outcome=row[9],
        reward=row[10],
        rewards=_json(row[11]) or {},
        error=row[12],
        duration=row[13],
        trial_dir=row[14],
        tokens=row[15],
        cost=row[16],
        models=tuple(_json(row[17]) or ()),
        other_model_tokens=row[18],
        stopped_by=row[19],
        own_report=_json(row[20]),
        replaces=row[21],
        retries=row[22],
        exit_code=row[23],
        judges=_json(row[24]) or {},
        error_class=row[25],
        engine=row[26],
    )


EMPTY_JSON = frozenset({"", "{}", "[]", "null"})


def _json(text: str | None) -> Any:
    """A JSON column, with the common empty values read without the parser."""
    return None if text is None or text in EMPTY_JSON else json.loads(text)
