"""What the store holds of runs and trials: results, steps, judgments, calls; the reads."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, insert, select, update

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
from pytest_hemra.core.trial import TrialResult
from pytest_hemra.core.usage import TOKEN_FIELDS
from pytest_hemra.store.base import StoreBase
from pytest_hemra.store.schema import (
    CURRENT,
    TRIAL_COLUMNS,
    TrialReader,
    after_trial,
    calibrations,
    calls,
    filter_clauses,
    jobs,
    json_column,
    judgments,
    runs,
    steps,
    trial_record,
    trials,
)


class ResultStore(StoreBase):
    """Runs, trials and their results, model calls and calibrations."""

    def run(self, run_id: str) -> RunRecord:
        with self._reading() as db:
            row = db.execute(select(runs).where(runs.c.id == run_id)).first()
        if row is None:
            raise StoreError(f"{self.name}: no run {run_id!r}")
        return _run_record(row._mapping)

    def runs(self) -> list[RunRecord]:
        with self._reading() as db:
            rows = db.execute(select(runs).order_by(runs.c.created_at)).all()
        return [_run_record(row._mapping) for row in rows]

    def trials(self, run_id: str, *, history: bool = False) -> list[TrialRecord]:
        """A run's trials in plan order (a retry takes its trial's place); with `history`, also
        the rows retries and resumes replaced."""
        where = trials.c.run_id == run_id if history else and_(trials.c.run_id == run_id, CURRENT)
        query = select(*TRIAL_COLUMNS).where(where).order_by(trials.c.plan_seq, trials.c.seq)
        with self._reading() as db:
            return TrialReader().records(db.execute(query))

    def trial(self, trial: str) -> TrialRecord:
        with self._reading() as db:
            row = db.execute(select(*TRIAL_COLUMNS).where(trials.c.id == trial)).first()
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
        clauses = filter_clauses(run_id, where)
        if after is not None:
            clauses.append(after_trial(after))
        query = (
            select(*TRIAL_COLUMNS)
            .where(*clauses)
            .order_by(trials.c.plan_seq, trials.c.seq)
            .limit(limit)
            .offset(offset)
        )
        with self._reading() as db:
            return TrialReader().records(db.execute(query))

    def count_trials(self, run_id: str, where: TrialFilter) -> int:
        """How many of a run's current trials `where` matches."""
        query = select(func.count()).select_from(trials).where(*filter_clauses(run_id, where))
        with self._reading() as db:
            return int(db.execute(query).scalar_one())

    def trial_counts(self, run_id: str | None = None) -> dict[str, TrialCounts]:
        """Each run's trials counted by status and by outcome (one run, or every run), from the
        (run_id, status, outcome) index alone."""
        t = trials.c
        query = select(t.run_id, t.status, t.outcome, func.count().label("n")).where(CURRENT)
        if run_id is not None:
            query = query.where(t.run_id == run_id)
        with self._reading() as db:
            rows = db.execute(query.group_by(t.run_id, t.status, t.outcome)).all()
        statuses: dict[str, dict[str, int]] = {}
        outcomes: dict[str, dict[str, int]] = {}
        for row in rows:
            mine = statuses.setdefault(row.run_id, {})
            mine[row.status] = mine.get(row.status, 0) + row.n
            if row.outcome is not None:
                theirs = outcomes.setdefault(row.run_id, {})
                theirs[row.outcome] = theirs.get(row.outcome, 0) + row.n
        return {run: TrialCounts(statuses[run], outcomes.get(run, {})) for run in statuses}

    def trial_detail(self, trial: str) -> TrialDetail:
        """A trial with its phases, times, worker, token counts and its job's state."""
        t = trials.c
        job_state = select(jobs.c.state).where(jobs.c.id == t.id).scalar_subquery()
        query = select(
            t.phases,
            t.started_at,
            t.finished_at,
            t.worker,
            func.coalesce(t.calls, 0).label("calls"),
            *(func.coalesce(t[name], 0).label(name) for name in TOKEN_FIELDS),
            job_state.label("job_state"),
        ).where(t.id == trial)
        with self._reading() as db:
            row = db.execute(query).first()
        if row is None:
            raise StoreError(f"{self.name}: no trial {trial!r}")
        values = row._asdict()
        phases = json_column(values.pop("phases")) or {}
        return TrialDetail(trial=self.trial(trial), phases=phases, **values)

    def finish_trial(self, trial: str, result: TrialResult) -> None:
        """Store a trial's result and close its job, before pytest reports the item. A row
        another runner replaced meanwhile (this runner was cut off from the store past its
        lease, and the trial taken over) is left as it is: the trial has one result, the new
        row's."""
        usage = result.usage
        cancelled = result.outcome == Outcome.CANCELLED
        own_report = None if result.own_report is None else asdict(result.own_report)
        with self._transaction() as tx:
            written = tx.execute(
                update(trials)
                .where(trials.c.id == trial, CURRENT)
                .values(
                    status=TrialStatus.CANCELLED if cancelled else TrialStatus.FINISHED,
                    outcome=result.outcome,
                    reward=result.reward,
                    rewards=json.dumps(result.rewards),
                    exit_code=result.exit_code,
                    error=result.error,
                    finished_at=result.finished_at,
                    duration=result.duration,
                    phases=json.dumps(result.phases),
                    trial_dir=result.trial_dir,
                    calls=usage.calls,
                    **usage.counts(),
                    cost=usage.cost,
                    cost_known=int(usage.cost is not None),
                    usage_unknown=usage.usage_unknown,
                    models=json.dumps(usage.models),
                    other_model_tokens=usage.other_model_tokens,
                    stopped_by=usage.stopped_by,
                    own_report=json.dumps(own_report),
                    judges=json.dumps({j.judge: j.score for j in result.judgments}),
                    error_class=result.swe_class,
                    agent_user=result.agent_user,
                    kept_processes=int(result.kept_processes),
                    cause=result.cause,
                )
            ).rowcount
            if not written:
                return
            run_id = tx.execute(select(trials.c.run_id).where(trials.c.id == trial)).scalar_one()
            if result.steps:
                tx.execute(
                    insert(steps),
                    [
                        {
                            "run_id": run_id,
                            "trial_id": trial,
                            "seq": seq,
                            "name": step.name,
                            "reward": step.reward,
                            "rewards": json.dumps(step.rewards),
                            "exit_code": step.exit_code,
                            "timed_out": int(step.timed_out),
                            "duration": step.duration,
                            "error": step.error,
                        }
                        for seq, step in enumerate(result.steps, start=1)
                    ],
                )
            if result.judgments:
                tx.execute(
                    insert(judgments),
                    [
                        {
                            "run_id": run_id,
                            "trial_id": trial,
                            **asdict(j),
                            "cost_known": int(j.cost is not None),
                        }
                        for j in result.judgments
                    ],
                )
            tx.execute(
                update(jobs)
                .where(jobs.c.id == trial)
                .values(state=JobState.CANCELLED if cancelled else JobState.DONE, lease_owner=None)
            )
            self._event(tx, run_id, trial, FINISHED, {"outcome": result.outcome})
            self._close_run(tx, run_id)

    def steps(self, trial: str) -> list[dict[str, Any]]:
        """A multi-step task's steps for one trial, in order: one row per step."""
        s = steps.c
        query = select(
            s.seq, s.name, s.reward, s.rewards, s.exit_code, s.timed_out, s.duration, s.error
        ).where(s.trial_id == trial)
        with self._reading() as db:
            rows = db.execute(query.order_by(s.seq)).all()
        found = [row._asdict() for row in rows]
        for step in found:
            step["rewards"] = json_column(step["rewards"]) or {}
        return found

    def judgments(self, trial: str) -> list[dict[str, Any]]:
        j = judgments.c
        query = select(
            j.judge,
            j.score,
            j.rationale,
            j.error,
            j.calls,
            j.input_tokens,
            j.output_tokens,
            j.cost,
            j.duration,
        ).where(j.trial_id == trial)
        with self._reading() as db:
            return [row._asdict() for row in db.execute(query.order_by(j.id))]

    def record_calibration(self, row: dict[str, Any]) -> None:
        names = ("judge", "model", "rubric_digest", "mae", "anchors", "threshold", "reliable")
        with self._transaction() as tx:
            tx.execute(
                insert(calibrations).values(at=time.time(), **{name: row[name] for name in names})
            )

    def latest_calibration(self, rubric_digest: str, model: str) -> dict[str, Any] | None:
        """The last calibration of a rubric (by digest) against a model, if any."""
        c = calibrations.c
        query = (
            select(c.judge, c.mae, c.anchors, c.threshold, c.reliable, c.at)
            .where(c.rubric_digest == rubric_digest, c.model == model)
            .order_by(c.at.desc(), c.id.desc())
            .limit(1)
        )
        with self._reading() as db:
            row = db.execute(query).first()
        return None if row is None else row._asdict()

    def record_call(self, call: CallRow) -> None:
        """One model call, written as it completes (by the gateway's writer thread)."""
        with self._transaction() as tx:
            tx.execute(
                insert(calls).values({name: _call_column(call, name) for name in CALL_COLUMNS})
            )

    def calls(self, trial: str | None = None, run_id: str | None = None) -> list[CallRow]:
        """Calls in the order they were recorded; a call whose usage is unknown (NULL tokens)
        reads `is_usage_known=False`, its counts 0 and its cost None."""
        c = calls.c
        columns = [c[name] for name in CALL_COLUMNS if name != "role"]
        query = select(*columns, func.coalesce(c.role, "agent").label("role"))
        if trial:
            query = query.where(c.trial_id == trial)
        elif run_id is not None:
            query = query.where(c.run_id == run_id)
        with self._reading() as db:
            rows = db.execute(query.order_by(c.id)).all()
        found = []
        for row in rows:
            values = row._asdict()
            is_usage_known = values["input_tokens"] is not None
            values.update({name: values[name] or 0 for name in TOKEN_FIELDS})
            values["refused"] = bool(values["refused"])
            values["headers"] = json.loads(values["headers"])
            found.append(CallRow(**values, is_usage_known=is_usage_known))
        return found

    def cell_cost(self, run_id: str, harness: str, model: str | None) -> float:
        """What one cell's calls have cost so far (a harness's; in a matrix run, a harness x
        model pair's), as `run_cost` counts."""
        t = trials.c
        same_model = t.model.is_(None) if model is None else t.model == model
        query = (
            select(func.coalesce(func.sum(calls.c.cost), 0))
            .select_from(calls.join(trials, calls.c.trial_id == t.id))
            .where(t.run_id == run_id, t.harness == harness, same_model)
        )
        with self._reading() as db:
            return float(db.execute(query).scalar_one())

    def run_cost(self, run_id: str) -> float:
        """What a run's calls have cost so far (calls of unknown price or usage count as 0: the
        run budget holds back a call's reservation when its usage could not be read)."""
        query = select(func.coalesce(func.sum(calls.c.cost), 0)).where(calls.c.run_id == run_id)
        with self._reading() as db:
            return float(db.execute(query).scalar_one())


def _run_record(row: Any) -> RunRecord:
    return RunRecord(
        id=row["id"],
        name=row["name"],
        created_at=row["created_at"],
        status=row["status"],
        spec=json.loads(row["spec"]),
        trials_dir=Path(row["trials_dir"]),
    )


def _call_column(call: CallRow, name: str) -> Any:
    if not call.is_usage_known and name in TOKEN_FIELDS:
        return None  # unknown, never 0
    value = getattr(call, name)
    if name == "refused":
        return int(value)
    return json.dumps(value, sort_keys=True) if name == "headers" else value
