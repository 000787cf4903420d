"""The queue: the plan recorded, jobs leased and renewed, cancelled, replaced; engine slots."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Text, and_, bindparam, exists, func, insert, select, update

from pytest_hemra.core.errors import StoreError
from pytest_hemra.core.events import CANCEL, RECORDED, RERUN, RESUME, RETRY
from pytest_hemra.core.lifecycle import TAKEN, JobState, RunStatus, TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import Claim, PlannedTrial, TrialRecord
from pytest_hemra.store import dialect
from pytest_hemra.store.results import ResultStore
from pytest_hemra.store.schema import CURRENT, SCHEMA_VERSION, jobs, runs, trial_id, trials

J, T, R = jobs.c, trials.c, runs.c
# the `error` of a trial a stopped run cancelled, by the run's status: why it has no result
STOP_REASONS = {
    RunStatus.CANCELLED: "cancelled by hemra cancel",
    RunStatus.INTERRUPTED: "interrupted (Ctrl-C)",
}
BEAT_CHUNK = 500  # trials a statement of `heartbeats` names (SQLite's bound-parameter limit)


class QueueStore(ResultStore):
    """Jobs with leases: who runs what, and what is left."""

    def record_plan(
        self,
        run_id: str,
        name: str,
        spec: dict[str, Any],
        trials_dir: Path,
        planned: Sequence[PlannedTrial],
        status: RunStatus = RunStatus.RECORDED,
    ) -> None:
        """Write the run, its resolved spec, every trial and its job, all or nothing.

        `status` is `queued` for a detached run, left for `hemra serve` to work."""
        now = time.time()
        with self._transaction() as tx:
            tx.execute(
                insert(runs).values(
                    id=run_id,
                    name=name,
                    created_at=now,
                    status=status,
                    spec=json.dumps(spec, sort_keys=True),
                    trials_dir=str(trials_dir),
                    schema_version=SCHEMA_VERSION,
                )
            )
            if planned:
                tx.execute(
                    insert(trials),
                    [
                        {
                            "id": trial_id(run_id, seq),
                            "run_id": run_id,
                            "seq": seq,
                            "plan_seq": seq,
                            "item_id": t.item_id,
                            "dataset": t.dataset,
                            "task": t.task,
                            "harness": t.harness,
                            "attempt": t.attempt,
                            "model": t.model,
                            "status": TrialStatus.PLANNED,
                        }
                        for seq, t in enumerate(planned)
                    ],
                )
                tx.execute(
                    insert(jobs),
                    [
                        {
                            "id": trial_id(run_id, seq),
                            "run_id": run_id,
                            "trial_id": trial_id(run_id, seq),
                            "state": JobState.QUEUED,
                            "created_at": now,
                        }
                        for seq in range(len(planned))
                    ],
                )
            self._event(tx, run_id, None, RECORDED, {"trials": len(planned)})

    def claim(self, trial: str, worker: str, lease_secs: float) -> Claim:
        """Lease a trial's job to `worker` if it is queued; return the job's state after.

        `leased` (`Claim.is_leased`) means it is this worker's to run; anything else
        (`cancelled`, `done`, `taken`: leased by another live runner) means it is not. A job
        queued in a run stopped meanwhile (a retry made as `hemra cancel` ran, a trial an
        xdist worker reached as Ctrl-C stopped the session) is cancelled, not leased."""
        now = time.time()
        with self._transaction() as tx:
            for stopped, reason in STOP_REASONS.items():
                stopped_runs = select(R.id).where(R.status == stopped)
                late = tx.execute(
                    update(jobs)
                    .where(J.id == trial, J.state == JobState.QUEUED, J.run_id.in_(stopped_runs))
                    .values(state=JobState.CANCELLED)
                ).rowcount
                if late:
                    tx.execute(
                        update(trials)
                        .where(T.id == trial, T.status == TrialStatus.PLANNED)
                        .values(
                            status=TrialStatus.CANCELLED,
                            outcome=Outcome.CANCELLED,
                            error=reason,
                            finished_at=now,
                        )
                    )
            if self._lease(tx, trial, worker, lease_secs, now):
                return Claim(trial, JobState.LEASED)
            state = tx.execute(select(J.state).where(J.id == trial)).scalar()
        if state is None:
            raise StoreError(f"{self.name}: no job for trial {trial!r}")
        return Claim(trial, TAKEN if state == JobState.LEASED else str(state))

    def claim_next(self, worker: str, lease_secs: float, run_id: str | None = None) -> Claim | None:
        """Lease the next queued job to `worker` (of `run_id`, else of any run still open,
        the oldest run first); None when no job is queued.

        For workers on several machines working one queue: on PostgreSQL the job's row is
        taken `FOR UPDATE SKIP LOCKED`, so workers claiming at once each take another job
        without waiting on one another (on SQLite the write transaction holds the store)."""
        now = time.time()
        query = (
            select(J.id)
            .select_from(jobs.join(runs, R.id == J.run_id))
            .where(J.state == JobState.QUEUED, R.status.not_in(RunStatus.CLOSED))
            .order_by(R.created_at, J.id)
            .limit(1)
            .with_for_update(of=jobs, skip_locked=True)
        )
        if run_id is not None:
            query = query.where(J.run_id == run_id)
        with self._transaction() as tx:
            found = tx.execute(query).scalar()
            if found is None:
                return None
            self._lease(tx, str(found), worker, lease_secs, now)
        return Claim(str(found), JobState.LEASED)

    def _lease(
        self, tx: Connection, trial: str, worker: str, lease_secs: float, now: float
    ) -> bool:
        """Lease a queued job (the job, then its trial, then its run: the order every write
        of the queue takes rows in, so that none waits on another in a cycle)."""
        claimed = tx.execute(
            update(jobs)
            .where(J.id == trial, J.state == JobState.QUEUED)
            .values(
                state=JobState.LEASED,
                lease_owner=worker,
                lease_expires=now + lease_secs,
                heartbeat_at=now,
            )
        ).rowcount
        if not claimed:
            return False
        tx.execute(
            update(trials)
            .where(T.id == trial)
            .values(status=TrialStatus.RUNNING, started_at=now, worker=worker)
        )
        of_trial = select(T.run_id).where(T.id == trial).scalar_subquery()
        tx.execute(  # not when already running: each claim would wait on the run's row
            update(runs)
            .where(R.id == of_trial, R.status.not_in((*RunStatus.STOPPED, RunStatus.RUNNING)))
            .values(status=RunStatus.RUNNING)
        )
        return True

    def heartbeat(self, trial: str, worker: str, lease_secs: float) -> str | None:
        """Renew `worker`'s lease on a running trial; return the job's state (`cancelling`
        when `hemra cancel` asked it to stop), None when the lease is no longer this worker's."""
        return self.heartbeats([trial], worker, lease_secs)[trial]

    def heartbeats(
        self, trial_ids: Sequence[str], worker: str, lease_secs: float
    ) -> dict[str, str | None]:
        """`heartbeat` for many trials of one worker, in one transaction of two statements a
        `BEAT_CHUNK` trials: a process running hundreds of trials at once renews them all in
        one write a beat (a statement a trial cost 89 ms of CPU a beat at 200 trials)."""
        now = time.time()
        states: dict[str, str | None] = dict.fromkeys(trial_ids)
        with self._transaction() as tx:
            for start in range(0, len(trial_ids), BEAT_CHUNK):
                chunk = list(trial_ids[start : start + BEAT_CHUNK])
                mine = and_(J.id.in_(chunk), J.lease_owner == worker)
                tx.execute(
                    update(jobs)
                    .where(mine, J.state.in_(JobState.LIVE))
                    .values(lease_expires=now + lease_secs, heartbeat_at=now)
                )
                for trial, state in tx.execute(select(J.id, J.state).where(mine)):
                    states[str(trial)] = str(state)
        return states

    def cancel_trials(self, trial_ids: Sequence[str], reason: str) -> int:
        """Record unfinished trials cancelled (never failed); finished ones are left alone."""
        with self._transaction() as tx:
            cancelled = self._cancel(tx, trial_ids, reason)
            of_trials = select(T.run_id).where(T.id.in_(list(trial_ids))).distinct()
            for run_id in tx.execute(of_trials).scalars().all():
                self._close_run(tx, run_id)
        return cancelled

    @staticmethod
    def _cancel(tx: Connection, trial_ids: Sequence[str], reason: str) -> int:
        now = time.time()
        cancelled = 0
        for trial in trial_ids:  # the job first, then the trial, as `claim` takes them
            tx.execute(
                update(jobs)
                .where(J.id == trial, J.state.in_(JobState.OPEN))
                .values(state=JobState.CANCELLED, lease_owner=None)
            )
            cancelled += tx.execute(
                update(trials)
                .where(T.id == trial, T.status.in_(TrialStatus.UNFINISHED))
                .values(
                    status=TrialStatus.CANCELLED,
                    outcome=Outcome.CANCELLED,
                    error=reason,
                    finished_at=now,
                )
            ).rowcount
        return cancelled

    def interrupt_run(self, run_id: str) -> int:
        """A session of the run stopped by Ctrl-C: its unfinished trials recorded cancelled
        (never failed), and the run `interrupted` while any trial is left without a result, so
        that `--hemra-resume` runs them again (a run `hemra cancel` cancelled stays
        `cancelled`: its trials were stopped on purpose). Returns the trials cancelled."""
        reason = STOP_REASONS[RunStatus.INTERRUPTED]
        with self._transaction() as tx:
            dialect.lock_row(tx, runs, run_id)  # first: no trial's write closes it meanwhile
            left = (
                tx.execute(
                    select(T.id).where(
                        T.run_id == run_id,
                        T.status.in_(TrialStatus.UNFINISHED),
                    )
                )
                .scalars()
                .all()
            )
            cancelled = self._cancel(tx, left, reason)
            without_result = exists().where(
                T.run_id == run_id, CURRENT, T.status == TrialStatus.CANCELLED
            )
            tx.execute(
                update(runs)
                .where(R.id == run_id, R.status != RunStatus.CANCELLED, without_result)
                .values(status=RunStatus.INTERRUPTED)
            )
            self._close_run(tx, run_id)
        return cancelled

    def cancel_run(self, run_id: str, is_alive: Callable[[str], bool]) -> tuple[int, int]:
        """`hemra cancel`: queued jobs are cancelled now; running ones are asked to stop
        (`cancelling`, seen by their runner's heartbeat), or cancelled now if their runner is
        gone. Returns (cancelled now, asked to stop)."""
        self.run(run_id)
        now = time.time()
        with self._transaction() as tx:
            tx.execute(update(runs).where(R.id == run_id).values(status=RunStatus.CANCELLED))
            leased = tx.execute(
                select(J.id, J.lease_owner, J.lease_expires).where(
                    J.run_id == run_id, J.state.in_(JobState.LIVE)
                )
            ).all()
            live = [
                job.id for job in leased if is_alive(job.lease_owner) and job.lease_expires > now
            ]
            for job in live:
                tx.execute(update(jobs).where(J.id == job).values(state=JobState.CANCELLING))
            asked = {"running": len(live)}  # not a lifecycle state: the event's count
            self._event(tx, run_id, None, CANCEL, asked)
        dead = [job.id for job in leased if job.id not in live]
        with self._reading() as db:
            queued = (
                db.execute(select(J.id).where(J.run_id == run_id, J.state == JobState.QUEUED))
                .scalars()
                .all()
            )
        return self.cancel_trials([*queued, *dead], "cancelled by hemra cancel"), len(live)

    def replace_trial(self, trial: str, *, retry: bool, cause: str | None = None) -> TrialRecord:
        """Run a trial again under a new row linked to it (`replaces`): an infrastructure
        retry (`retry`), or a resume of a trial whose runner died or that was cancelled; with
        a `cause` (an outage the runner waited out), a `rerun` that uses up no retry.

        A row already replaced is not replaced twice: its replacement is returned (two
        runners resuming one run at once make one new row, not two)."""
        with self._transaction() as tx:
            new_id = self._replace(tx, trial, retry=retry, cause=cause)
        return self.trial(new_id)

    def take_over(self, trial: str, is_alive: Callable[[str], bool]) -> TrialRecord | None:
        """Resume a running trial whose runner is gone (its lease expired, or its process seen
        dead on this host) under a new row, queued: for a live runner to run it. None when
        its runner may still live, or it is not running any more (finished, or another runner
        took it over first: the check and the new row are one transaction)."""
        with self._reading() as db:
            if not self._is_stale(db, trial, is_alive):
                return None  # read first: a runner waiting on a live one writes nothing
        with self._transaction() as tx:
            run_id = tx.execute(select(T.run_id).where(T.id == trial)).scalar()
            if run_id is None:
                raise StoreError(f"{self.name}: no trial {trial!r}")
            dialect.lock_row(tx, runs, run_id)  # as `_replace` takes it, first
            if not self._is_stale(tx, trial, is_alive):
                return None
            new_id = self._replace(tx, trial, retry=False, cause=None)
        return self.trial(new_id)

    @staticmethod
    def _is_stale(db: Connection, trial: str, is_alive: Callable[[str], bool]) -> bool:
        found = db.execute(
            select(J.state, J.lease_owner, J.lease_expires).where(J.id == trial)
        ).first()
        if found is None or found.state not in JobState.LIVE:
            return False
        return (found.lease_expires or 0) < time.time() or not is_alive(found.lease_owner)

    def replacement(self, trial: str) -> TrialRecord | None:
        """The row that runs a replaced trial again, if any."""
        old, new = trials.alias("old"), trials.alias("new")
        query = (
            select(new.c.id)
            .select_from(
                old.join(
                    new,
                    and_(
                        new.c.run_id == old.c.run_id,
                        new.c.plan_seq == old.c.plan_seq,
                        new.c.replaces == old.c.id,
                    ),
                )
            )
            .where(old.c.id == trial)
        )
        with self._reading() as db:
            found = db.execute(query).scalar()
        return None if found is None else self.trial(str(found))

    def _replace(self, tx: Connection, trial: str, *, retry: bool, cause: str | None) -> str:
        old = tx.execute(
            select(
                T.run_id,
                T.item_id,
                T.dataset,
                T.task,
                T.harness,
                T.attempt,
                func.coalesce(T.retries, 0).label("retries"),
                T.plan_seq,
            ).where(T.id == trial)
        ).first()
        if old is None:
            raise StoreError(f"{self.name}: no trial {trial!r}")
        run_id = old.run_id
        dialect.lock_row(tx, runs, run_id)  # the next seq is this one's alone
        done = tx.execute(
            select(T.id).where(T.run_id == run_id, T.plan_seq == old.plan_seq, T.replaces == trial)
        ).scalar()
        if done is not None:
            return str(done)
        seq = tx.execute(select(func.max(T.seq) + 1).where(T.run_id == run_id)).scalar_one()
        new_id = trial_id(run_id, seq)
        tx.execute(update(trials).where(T.id == trial).values(status=TrialStatus.REPLACED))
        tx.execute(
            update(jobs).where(J.id == trial).values(state=JobState.REPLACED, lease_owner=None)
        )
        tx.execute(
            insert(trials).values(
                id=new_id,
                run_id=run_id,
                seq=seq,
                plan_seq=old.plan_seq,
                item_id=old.item_id,
                dataset=old.dataset,
                task=old.task,
                harness=old.harness,
                attempt=old.attempt,
                replaces=trial,
                retries=old.retries + int(retry and cause is None),
                status=TrialStatus.PLANNED,
            )
        )
        tx.execute(
            insert(jobs).values(
                id=new_id,
                run_id=run_id,
                trial_id=new_id,
                state=JobState.QUEUED,
                created_at=time.time(),
            )
        )
        tx.execute(
            update(runs)
            .where(R.id == run_id, R.status == RunStatus.FINISHED)
            .values(status=RunStatus.RUNNING)
        )
        if cause is not None:
            self._event(tx, run_id, new_id, RERUN, {"replaces": trial, "cause": cause})
        else:
            self._event(tx, run_id, new_id, RETRY if retry else RESUME, {"replaces": trial})
        return new_id

    def stale_trials(self, run_id: str, is_alive: Callable[[str], bool]) -> list[str]:
        """Running trials whose runner is gone: its lease expired, or its process is dead."""
        now = time.time()
        with self._reading() as db:
            rows = db.execute(
                select(J.id, J.lease_owner, J.lease_expires).where(
                    J.run_id == run_id, J.state.in_(JobState.LIVE)
                )
            ).all()
        return [
            row.id
            for row in rows
            if (row.lease_expires or 0) < now or not is_alive(row.lease_owner)
        ]

    def runnable_runs(self, is_alive: Callable[[str], bool]) -> list[str]:
        """Runs `hemra serve` should work: queued jobs, or running ones whose runner is gone."""
        with self._reading() as db:
            ids = (
                db.execute(
                    select(R.id).where(R.status.not_in(RunStatus.CLOSED)).order_by(R.created_at)
                )
                .scalars()
                .all()
            )
            queued = {
                run_id
                for run_id in ids
                if db.execute(
                    select(J.id).where(J.run_id == run_id, J.state == JobState.QUEUED).limit(1)
                ).first()
            }
        return [run_id for run_id in ids if run_id in queued or self.stale_trials(run_id, is_alive)]

    def is_trial_over(self, trial: str, is_alive: Callable[[str], bool]) -> bool:
        """Whether nobody runs a trial of this store any more (what it left on an engine may
        go): its job is not held, or the process holding it on this host is gone. A trial
        this store does not hold is not over: it is someone else's."""
        with self._reading() as db:
            found = db.execute(select(J.state, J.lease_owner).where(J.id == trial)).first()
        if found is None:
            return False
        return found.state not in JobState.LIVE or not is_alive(found.lease_owner)

    def job_state(self, trial: str) -> str | None:
        with self._reading() as db:
            found = db.execute(select(J.state).where(J.id == trial)).scalar()
        return None if found is None else str(found)

    def reopen_run(self, run_id: str) -> None:
        """A stopped run taken up again, its cancelled trials queued anew: an interrupted one
        (`--hemra-resume`), a cancelled one asked to finish after all
        (`--hemra-resume-cancelled`). With nothing left to run it is finished at once."""
        with self._transaction() as tx:
            tx.execute(
                update(runs)
                .where(R.id == run_id, R.status.in_(RunStatus.STOPPED))
                .values(status=RunStatus.RUNNING)
            )
            self._close_run(tx, run_id)

    def job_counts(self, run_id: str) -> dict[str, int]:
        query = select(J.state, func.count().label("n")).where(J.run_id == run_id)
        with self._reading() as db:
            return {row.state: row.n for row in db.execute(query.group_by(J.state))}

    def deselect_trials(self, run_id: str, item_ids: Sequence[str]) -> None:
        """Trials left out by pytest's -k or -m: never run in this session, never scored."""
        item = bindparam("item", type_=Text)
        in_run = and_(T.run_id == run_id, T.item_id == item)
        planned = update(trials).where(in_run, T.status == TrialStatus.PLANNED)
        deselected = select(T.id).where(in_run, T.status == TrialStatus.DESELECTED)
        queued = update(jobs).where(J.trial_id.in_(deselected), J.state == JobState.QUEUED)
        rows = [{"item": found} for found in item_ids]
        if not rows:
            return
        with self._transaction() as tx:
            tx.execute(planned.values(status=TrialStatus.DESELECTED), rows)
            tx.execute(queued.values(state=JobState.DESELECTED), rows)
