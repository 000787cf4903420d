"""The queue: the plan recorded, jobs leased and renewed, cancelled, replaced; engine slots."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_hemra.core.errors import StoreError
from pytest_hemra.core.events import CANCEL, RECORDED, RERUN, RESUME, RETRY
from pytest_hemra.core.lifecycle import TAKEN, JobState, RunStatus, TrialStatus, sql_list
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import (
    EngineSlot,
    PlannedTrial,
    TrialRecord,
)
from pytest_hemra.store.dialect import Connection
from pytest_hemra.store.results import ResultStore
from pytest_hemra.store.schema import (
    SCHEMA_VERSION,
    trial_id,
)


class QueueStore(ResultStore):
    """Jobs with leases: who runs what, and what is left."""

    def record_plan(
        self,
        run_id: str,
        name: str,
        spec: dict[str, Any],
        trials_dir: Path,
        trials: Sequence[PlannedTrial],
        status: RunStatus = RunStatus.RECORDED,
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
                " attempt, model, status)"
                f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '{TrialStatus.PLANNED}')",
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
                        t.model,
                    )
                    for seq, t in enumerate(trials)
                ],
            )
            tx.executemany(
                "INSERT INTO jobs (id, run_id, trial_id, state, created_at)"
                f" VALUES (?, ?, ?, '{JobState.QUEUED}', ?)",
                [
                    (trial_id(run_id, seq), run_id, trial_id(run_id, seq), now)
                    for seq in range(len(trials))
                ],
            )
            self._event(tx, run_id, None, RECORDED, {"trials": len(trials)})

    def claim(self, trial: str, worker: str, lease_secs: float) -> str:
        """Lease a trial's job to `worker` if it is queued; return the job's state after.

        `leased` by `worker` means it is this worker's to run; anything else (`cancelled`,
        `done`, `leased` by another live runner) means it is not. A job queued in a run
        cancelled meanwhile (a retry made as `hemra cancel` ran) is cancelled, not leased."""
        now = time.time()
        with self._transaction() as tx:
            late = tx.execute(
                f"UPDATE jobs SET state = '{JobState.CANCELLED}' WHERE id = ?"
                f" AND state = '{JobState.QUEUED}'"
                f" AND run_id IN (SELECT id FROM runs WHERE status = '{RunStatus.CANCELLED}')",
                [trial],
            ).rowcount
            if late:
                tx.execute(
                    f"UPDATE trials SET status = '{TrialStatus.CANCELLED}',"
                    f" outcome = '{Outcome.CANCELLED}',"
                    " error = 'cancelled by hemra cancel', finished_at = ?"
                    f" WHERE id = ? AND status = '{TrialStatus.PLANNED}'",
                    [now, trial],
                )
            if self._lease(tx, trial, worker, lease_secs, now):
                return JobState.LEASED
            found = tx.execute(
                "SELECT state, lease_owner FROM jobs WHERE id = ?", [trial]
            ).fetchone()
        if found is None:
            raise StoreError(f"{self.name}: no job for trial {trial!r}")
        return TAKEN if found[0] == JobState.LEASED else str(found[0])

    def claim_next(self, worker: str, lease_secs: float, run_id: str | None = None) -> str | None:
        """Lease the next queued job to `worker` (of `run_id`, else of any run still open,
        the oldest run first) and return its trial's id; None when no job is queued.

        For workers on several machines working one queue: on PostgreSQL the job's row is
        taken `FOR UPDATE SKIP LOCKED`, so workers claiming at once each take another job
        without waiting on one another (on SQLite the write transaction holds the store)."""
        now = time.time()
        with self._transaction() as tx:
            found = tx.execute(
                "SELECT jobs.id FROM jobs JOIN runs ON runs.id = jobs.run_id"
                f" WHERE jobs.state = '{JobState.QUEUED}'"
                f" AND runs.status NOT IN {sql_list(RunStatus.CLOSED)}"
                " AND (CAST(? AS TEXT) IS NULL OR jobs.run_id = ?)"
                " ORDER BY runs.created_at, jobs.id LIMIT 1" + self.dialect.skip_locked,
                [run_id, run_id],
            ).fetchone()
            if found is None:
                return None
            self._lease(tx, str(found[0]), worker, lease_secs, now)
        return str(found[0])

    def _lease(
        self, tx: Connection, trial: str, worker: str, lease_secs: float, now: float
    ) -> bool:
        """Lease a queued job (the job, then its trial, then its run: the order every write
        of the queue takes rows in, so that none waits on another in a cycle)."""
        claimed = tx.execute(
            f"UPDATE jobs SET state = '{JobState.LEASED}', lease_owner = ?, lease_expires = ?,"
            f" heartbeat_at = ? WHERE id = ? AND state = '{JobState.QUEUED}'",
            [worker, now + lease_secs, now, trial],
        ).rowcount
        if not claimed:
            return False
        tx.execute(
            f"UPDATE trials SET status = '{TrialStatus.RUNNING}', started_at = ?, worker = ?"
            " WHERE id = ?",
            [now, worker, trial],
        )
        tx.execute(  # not when already running: each claim would wait on the run's row
            f"UPDATE runs SET status = '{RunStatus.RUNNING}' WHERE id ="
            " (SELECT run_id FROM trials WHERE id = ?)"
            f" AND status NOT IN {sql_list((RunStatus.CANCELLED, RunStatus.RUNNING))}",
            [trial],
        )
        return True

    def heartbeat(self, trial: str, worker: str, lease_secs: float) -> str | None:
        """Renew `worker`'s lease on a running trial; return the job's state (`cancelling`
        when `hemra cancel` asked it to stop), None when the lease is no longer this worker's."""
        return self.heartbeats([trial], worker, lease_secs)[trial]

    def heartbeats(
        self, trials: Sequence[str], worker: str, lease_secs: float
    ) -> dict[str, str | None]:
        """`heartbeat` for many trials of one worker, in one transaction: a process running
        hundreds of trials at once renews them all in one write a beat."""
        now = time.time()
        states: dict[str, str | None] = {}
        with self._transaction() as tx:
            for trial in trials:
                tx.execute(
                    "UPDATE jobs SET lease_expires = ?, heartbeat_at = ?"
                    f" WHERE id = ? AND lease_owner = ? AND state IN {sql_list(JobState.LIVE)}",
                    [now + lease_secs, now, trial, worker],
                )
                found = tx.execute(
                    "SELECT state FROM jobs WHERE id = ? AND lease_owner = ?", [trial, worker]
                ).fetchone()
                states[trial] = None if found is None else str(found[0])
        return states

    def cancel_trials(self, trials: Sequence[str], reason: str) -> int:
        """Record unfinished trials cancelled (never failed); finished ones are left alone."""
        now = time.time()
        cancelled = 0
        with self._transaction() as tx:
            for trial in trials:  # the job first, then the trial, as `claim` takes them
                tx.execute(
                    f"UPDATE jobs SET state = '{JobState.CANCELLED}', lease_owner = NULL"
                    f" WHERE id = ? AND state IN {sql_list(JobState.OPEN)}",
                    [trial],
                )
                cancelled += tx.execute(
                    f"UPDATE trials SET status = '{TrialStatus.CANCELLED}',"
                    f" outcome = '{Outcome.CANCELLED}', error = ?, finished_at = ?"
                    f" WHERE id = ? AND status IN {sql_list(TrialStatus.UNFINISHED)}",
                    [reason, now, trial],
                ).rowcount
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
            tx.execute(f"UPDATE runs SET status = '{RunStatus.CANCELLED}' WHERE id = ?", [run_id])
            leased = tx.execute(
                "SELECT id, lease_owner, lease_expires FROM jobs WHERE run_id = ?"
                f" AND state IN {sql_list(JobState.LIVE)}",
                [run_id],
            ).fetchall()
            live = [job for job, owner, expires in leased if is_alive(owner) and expires > now]
            tx.executemany(
                f"UPDATE jobs SET state = '{JobState.CANCELLING}' WHERE id = ?",
                [(job,) for job in live],
            )
            asked = {"running": len(live)}  # not a lifecycle state: the event's count
            self._event(tx, run_id, None, CANCEL, asked)
        dead = [job for job, *_ in leased if job not in live]
        queued = [
            r[0]
            for r in self.db.execute(
                f"SELECT id FROM jobs WHERE run_id = ? AND state = '{JobState.QUEUED}'", [run_id]
            )
        ]
        return self.cancel_trials(queued + dead, "cancelled by hemra cancel"), len(live)

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
        if not self._is_stale(self.db, trial, is_alive):
            return None  # read first: a runner waiting on a live one writes nothing
        with self._transaction() as tx:
            run_id = tx.execute("SELECT run_id FROM trials WHERE id = ?", [trial]).fetchone()
            if run_id is None:
                raise StoreError(f"{self.name}: no trial {trial!r}")
            self.dialect.lock_row(tx, "runs", run_id[0])  # as `_replace` takes it, first
            if not self._is_stale(tx, trial, is_alive):
                return None
            new_id = self._replace(tx, trial, retry=False, cause=None)
        return self.trial(new_id)

    @staticmethod
    def _is_stale(db: Any, trial: str, is_alive: Callable[[str], bool]) -> bool:
        found = db.execute(
            "SELECT state, lease_owner, lease_expires FROM jobs WHERE id = ?", [trial]
        ).fetchone()
        if found is None or found[0] not in JobState.LIVE:
            return False
        _, owner, expires = found
        return (expires or 0) < time.time() or not is_alive(owner)

    def replacement(self, trial: str) -> TrialRecord | None:
        """The row that runs a replaced trial again, if any."""
        found = self.db.execute(
            "SELECT r.id FROM trials t JOIN trials r ON r.run_id = t.run_id"
            " AND r.plan_seq = t.plan_seq AND r.replaces = t.id WHERE t.id = ?",
            [trial],
        ).fetchone()
        return None if found is None else self.trial(str(found[0]))

    def _replace(self, tx: Connection, trial: str, *, retry: bool, cause: str | None) -> str:
        old = tx.execute(
            "SELECT run_id, item_id, dataset, task, harness, attempt, coalesce(retries, 0),"
            " plan_seq FROM trials WHERE id = ?",
            [trial],
        ).fetchone()
        if old is None:
            raise StoreError(f"{self.name}: no trial {trial!r}")
        run_id = old[0]
        self.dialect.lock_row(tx, "runs", run_id)  # the next seq is this one's alone
        done = tx.execute(
            "SELECT id FROM trials WHERE run_id = ? AND plan_seq = ? AND replaces = ?",
            [run_id, old[7], trial],
        ).fetchone()
        if done is not None:
            return str(done[0])
        seq = tx.execute("SELECT max(seq) + 1 FROM trials WHERE run_id = ?", [run_id])
        new_id = trial_id(run_id, seq.fetchone()[0])
        tx.execute(f"UPDATE trials SET status = '{TrialStatus.REPLACED}' WHERE id = ?", [trial])
        tx.execute(
            f"UPDATE jobs SET state = '{JobState.REPLACED}', lease_owner = NULL WHERE id = ?",
            [trial],
        )
        tx.execute(
            "INSERT INTO trials (id, run_id, seq, plan_seq, item_id, dataset, task, harness,"
            " attempt, replaces, retries, status)"
            f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '{TrialStatus.PLANNED}')",
            [
                new_id,
                run_id,
                int(new_id.rsplit(".", 1)[1]),
                old[7],
                *old[1:6],
                trial,
                old[6] + int(retry and cause is None),
            ],
        )
        tx.execute(
            "INSERT INTO jobs (id, run_id, trial_id, state, created_at)"
            f" VALUES (?, ?, ?, '{JobState.QUEUED}', ?)",
            [new_id, run_id, new_id, time.time()],
        )
        tx.execute(
            f"UPDATE runs SET status = '{RunStatus.RUNNING}' WHERE id = ?"
            f" AND status = '{RunStatus.FINISHED}'",
            [run_id],
        )
        if cause is not None:
            self._event(tx, run_id, new_id, RERUN, {"replaces": trial, "cause": cause})
        else:
            self._event(tx, run_id, new_id, RETRY if retry else RESUME, {"replaces": trial})
        return new_id

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
            self.dialect.lock(tx, "hemra placements")  # the count and the place, as one
            held = tx.execute(
                "SELECT p.trial_id, p.owner, j.state, j.lease_expires FROM placements p"
                " LEFT JOIN jobs j ON j.id = p.trial_id"
            ).fetchall()
            gone = [
                (placed,)
                for placed, holder, state, expires in held
                if state not in JobState.LIVE or (expires or 0) < now or not is_alive(holder)
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
                "INSERT INTO placements (trial_id, run_id, engine, address, owner, at)"
                " VALUES (?, (SELECT run_id FROM trials WHERE id = ?), ?, ?, ?, ?)"
                " ON CONFLICT (trial_id) DO UPDATE SET run_id = excluded.run_id,"
                " engine = excluded.engine, address = excluded.address, owner = excluded.owner,"
                " at = excluded.at",
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
            f" AND state IN {sql_list(JobState.LIVE)}",
            [run_id],
        ).fetchall()
        return [job for job, owner, expires in rows if (expires or 0) < now or not is_alive(owner)]

    def runnable_runs(self, is_alive: Callable[[str], bool]) -> list[str]:
        """Runs `hemra serve` should work: queued jobs, or running ones whose runner is gone."""
        ids = [
            r[0]
            for r in self.db.execute(
                f"SELECT id FROM runs WHERE status NOT IN {sql_list(RunStatus.CLOSED)}"
                " ORDER BY created_at"
            )
        ]
        return [
            run_id
            for run_id in ids
            if self.db.execute(
                f"SELECT 1 FROM jobs WHERE run_id = ? AND state = '{JobState.QUEUED}' LIMIT 1",
                [run_id],
            ).fetchone()
            or self.stale_trials(run_id, is_alive)
        ]

    def is_trial_over(self, trial: str, is_alive: Callable[[str], bool]) -> bool:
        """Whether nobody runs a trial of this store any more (what it left on an engine may
        go): its job is not held, or the process holding it on this host is gone. A trial
        this store does not hold is not over: it is someone else's."""
        found = self.db.execute(
            "SELECT state, lease_owner FROM jobs WHERE id = ?", [trial]
        ).fetchone()
        if found is None:
            return False
        state, owner = found
        return state not in JobState.LIVE or not is_alive(owner)

    def job_state(self, trial: str) -> str | None:
        found = self.db.execute("SELECT state FROM jobs WHERE id = ?", [trial]).fetchone()
        return None if found is None else str(found[0])

    def reopen_run(self, run_id: str) -> None:
        """A cancelled run asked to finish after all (`--hemra-resume-cancelled`)."""
        with self._transaction() as tx:
            tx.execute(
                f"UPDATE runs SET status = '{RunStatus.RUNNING}' WHERE id = ?"
                f" AND status = '{RunStatus.CANCELLED}'",
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
                f"UPDATE trials SET status = '{TrialStatus.DESELECTED}' WHERE run_id = ?"
                f" AND item_id = ? AND status = '{TrialStatus.PLANNED}'",
                [(run_id, item) for item in item_ids],
            )
            tx.executemany(
                f"UPDATE jobs SET state = '{JobState.DESELECTED}' WHERE trial_id IN"
                " (SELECT id FROM trials WHERE run_id = ? AND item_id = ?"
                f" AND status = '{TrialStatus.DESELECTED}')"
                f" AND state = '{JobState.QUEUED}'",
                [(run_id, item) for item in item_ids],
            )
