"""What the store holds of runs and trials: results, steps, judgments, calls; the reads."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pytest_hemra.core.errors import StoreError
from pytest_hemra.core.events import FINISHED
from pytest_hemra.core.lifecycle import JobState, TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import (
    CALL_COLUMNS,
    CallRow,
    RunRecord,
    TrialCounts,
    TrialDetail,
    TrialFilter,
    TrialRecord,
)
from pytest_hemra.core.usage import TOKEN_FIELDS
from pytest_hemra.store.base import StoreBase
from pytest_hemra.store.schema import (
    CURRENT,
    EMPTY_USAGE,
    TRIAL_COLUMNS,
    filter_clauses,
    json_column,
    trial_record,
)


class ResultStore(StoreBase):
    """Runs, trials and their results, model calls and calibrations."""

    def run(self, run_id: str) -> RunRecord:
        row = self.db.execute(
            "SELECT id, name, created_at, status, spec, trials_dir FROM runs WHERE id = ?",
            [run_id],
        ).fetchone()
        if row is None:
            raise StoreError(f"{self.name}: no run {run_id!r}")
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
        return [trial_record(row) for row in rows]

    def trial(self, trial: str) -> TrialRecord:
        query = f"SELECT {TRIAL_COLUMNS} FROM trials WHERE id = ?"
        row = self.db.execute(query, [trial]).fetchone()
        if row is None:
            raise StoreError(f"{self.name}: no trial {trial!r}")
        return trial_record(row)

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
        clauses, args = filter_clauses(run_id, where)
        if after is not None:
            clauses.append("(plan_seq, seq) > (SELECT plan_seq, seq FROM trials WHERE id = ?)")
            args.append(after)
        rows = self.db.execute(
            f"SELECT {TRIAL_COLUMNS} FROM trials WHERE {' AND '.join(clauses)}"
            " ORDER BY plan_seq, seq LIMIT ? OFFSET ?",
            [*args, self.dialect.no_limit if limit is None else limit, offset],
        ).fetchall()
        return [trial_record(row) for row in rows]

    def count_trials(self, run_id: str, where: TrialFilter) -> int:
        """How many of a run's current trials `where` matches."""
        clauses, args = filter_clauses(run_id, where)
        query = f"SELECT count(*) FROM trials WHERE {' AND '.join(clauses)}"
        return int(self.db.execute(query, args).fetchone()[0])

    def trial_counts(self, run_id: str | None = None) -> dict[str, TrialCounts]:
        """Each run's trials counted by status and by outcome (one run, or every run), from the
        (run_id, status, outcome) index alone."""
        where, args = ("run_id = ? AND", [run_id]) if run_id is not None else ("", [])
        rows = self.db.execute(
            "SELECT run_id, status, outcome, count(*) FROM trials"
            f" WHERE {where} {CURRENT} GROUP BY run_id, status, outcome",
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
            raise StoreError(f"{self.name}: no trial {trial!r}")
        return TrialDetail(
            trial=self.trial(trial),
            phases=json_column(row[0]) or {},
            started_at=row[1],
            finished_at=row[2],
            worker=row[3],
            calls=row[4],
            **dict(zip(TOKEN_FIELDS, row[5:9], strict=True)),
            job_state=row[9],
        )

    def finish_trial(self, trial: str, result: dict[str, Any]) -> None:
        """Store a trial's result and close its job, before pytest reports the item. A row
        another runner replaced meanwhile (this runner was cut off from the store past its
        lease, and the trial taken over) is left as it is: the trial has one result, the new
        row's."""
        usage = result.get("usage") or EMPTY_USAGE
        cancelled = result["outcome"] == Outcome.CANCELLED
        status = TrialStatus.CANCELLED if cancelled else TrialStatus.FINISHED
        with self._transaction() as tx:
            written = tx.execute(
                "UPDATE trials SET status = ?, outcome = ?, reward = ?, rewards = ?,"
                " exit_code = ?, error = ?, finished_at = ?, duration = ?, phases = ?,"
                " trial_dir = ?, calls = ?, input_tokens = ?, output_tokens = ?,"
                " cache_read_tokens = ?, cache_write_tokens = ?, cost = ?, cost_known = ?,"
                " usage_unknown = ?, models = ?, other_model_tokens = ?, stopped_by = ?,"
                " own_report = ?, judges = ?, error_class = ?, agent_user = ?,"
                " kept_processes = ?, cause = ?"
                f" WHERE id = ? AND {CURRENT}",
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
                    usage.get("usage_unknown", 0),
                    json.dumps(usage["models"]),
                    usage.get("other_model_tokens", 0),
                    usage.get("stopped_by"),
                    json.dumps(result.get("own_report")),
                    json.dumps({j["judge"]: j["score"] for j in result.get("judgments") or []}),
                    result.get("swe_class"),
                    result.get("agent_user"),
                    int(bool(result.get("kept_processes"))),
                    result.get("cause"),
                    trial,
                ],
            ).rowcount
            if not written:
                return
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
                [JobState.CANCELLED if cancelled else JobState.DONE, trial],
            )
            self._event(tx, run_id, trial, FINISHED, {"outcome": result["outcome"]})
            self._close_run(tx, run_id)

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
            step["rewards"] = json_column(step["rewards"]) or {}
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

    def record_call(self, call: CallRow) -> None:
        """One model call, written as it completes (by the gateway's writer thread)."""
        with self._transaction() as tx:
            tx.execute(
                f"INSERT INTO calls ({', '.join(CALL_COLUMNS)})"
                f" VALUES ({', '.join('?' * len(CALL_COLUMNS))})",
                [_call_column(call, name) for name in CALL_COLUMNS],
            )

    def calls(self, trial: str | None = None, run_id: str | None = None) -> list[CallRow]:
        """Calls in the order they were recorded; a call whose usage is unknown (NULL tokens)
        reads `is_usage_known=False`, its counts 0 and its cost None."""
        where, args = ("trial_id = ?", [trial]) if trial else ("run_id = ?", [run_id])
        if trial is None and run_id is None:
            where, args = ("1 = 1", [])
        rows = self.db.execute(
            f"SELECT {', '.join(CALL_COLUMNS[:-1])}, coalesce(role, 'agent')"
            f" FROM calls WHERE {where} ORDER BY id",
            args,
        ).fetchall()
        found = []
        for row in rows:
            columns = dict(zip(CALL_COLUMNS[:20], row[:20], strict=True))
            is_usage_known = columns["input_tokens"] is not None
            columns.update({name: columns[name] or 0 for name in TOKEN_FIELDS})
            found.append(
                CallRow(
                    **columns,
                    refused=bool(row[20]),
                    headers=json.loads(row[21]),
                    role=row[22],
                    is_usage_known=is_usage_known,
                )
            )
        return found

    def cell_cost(self, run_id: str, harness: str, model: str | None) -> float:
        """What one cell's calls have cost so far (a harness's; in a matrix run, a harness x
        model pair's), as `run_cost` counts."""
        found = self.db.execute(
            "SELECT coalesce(sum(calls.cost), 0) FROM calls JOIN trials"
            " ON calls.trial_id = trials.id WHERE trials.run_id = ? AND trials.harness = ?"
            " AND (trials.model = ? OR (trials.model IS NULL AND CAST(? AS TEXT) IS NULL))",
            [run_id, harness, model, model],
        ).fetchone()
        return float(found[0])

    def run_cost(self, run_id: str) -> float:
        """What a run's calls have cost so far (calls of unknown price or usage count as 0: the
        run budget holds back a call's reservation when its usage could not be read)."""
        found = self.db.execute(
            "SELECT coalesce(sum(cost), 0) FROM calls WHERE run_id = ?", [run_id]
        ).fetchone()
        return float(found[0])


def _call_column(call: CallRow, name: str) -> Any:
    if not call.is_usage_known and name in TOKEN_FIELDS:
        return None  # unknown, never 0
    value = getattr(call, name)
    if name == "refused":
        return int(value)
    return json.dumps(value, sort_keys=True) if name == "headers" else value
