"""Shared jobs: jobs a harness kind runs for several trials at once (Harbor's `harbor run`).

Each trial still claims its own job in the queue; the trials a shared job serves agree on
which jobs were started and which trial took which of their results through one board per
run and kind, read and written back under the board's lock (a row in `shared_locks`), so
items in other workers or in a later resume see the same board. The row names its holder by
process; the threads of one process (`run/lanes.py`) take turns on a lock of the process too.
A job is the kind's own record (JSON); a claim is a result key (unique in the run) and the
trial that took it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, delete, select

from pytest_hemra.store import dialect
from pytest_hemra.store.base import StoreBase
from pytest_hemra.store.owner import is_alive, owner_name
from pytest_hemra.store.schema import shared_claims, shared_jobs, shared_locks

LOCK_SECS = 600.0  # a holder on another host that stopped answering is taken over after this
LOCK_POLL_SECS = 0.1
_THREADS: dict[str, threading.Lock] = {}  # a board's lock among the threads of this process
_THREADS_MADE = threading.Lock()


@dataclass
class SharedBoard:
    """A run's shared jobs of one kind, in the order started, and their results' claims."""

    jobs: list[dict[str, Any]] = field(default_factory=list)  # each has a unique "name"
    claims: dict[str, str] = field(default_factory=dict)  # result key -> trial id


class SharedJobStore(StoreBase):
    """The boards of shared jobs."""

    def shared_board(self, run_id: str, kind: str) -> SharedBoard:
        """The board as it is now (read only)."""
        j, c = shared_jobs.c, shared_claims.c
        with self._reading() as db:
            data = db.execute(
                select(j.data).where(j.run_id == run_id, j.kind == kind).order_by(j.seq)
            ).scalars()
            jobs = [json.loads(text) for text in data]
            claimed = db.execute(
                select(c.result, c.trial_id).where(c.run_id == run_id, c.kind == kind)
            )
            claims = {str(row.result): str(row.trial_id) for row in claimed}
        return SharedBoard(jobs, claims)

    @contextmanager
    def locked_shared_board(
        self, run_id: str, kind: str, owner: str | None = None
    ) -> Iterator[SharedBoard]:
        """The board, changed in place by the caller and written back, while this process holds
        the board's lock: a row in the store, taken and given back in short transactions, so
        the caller may take its time (start a container) without holding up other writers.
        A lock whose holder died is taken over (at once on this host, else on its expiry).
        What changed is written even when the caller fails (a job started stays on the board)."""
        holder = owner or owner_name()
        lock_id = f"{run_id}/{kind}"
        with _THREADS_MADE:
            threads = _THREADS.setdefault(f"{self.address}\0{lock_id}", threading.Lock())
        with threads:
            yield from self._locked_board(run_id, kind, lock_id, holder)

    def _locked_board(
        self, run_id: str, kind: str, lock_id: str, holder: str
    ) -> Iterator[SharedBoard]:
        self._take_lock(lock_id, holder)
        failure: BaseException | None = None
        try:
            board = self.shared_board(run_id, kind)
            before = {job["name"]: json.dumps(job, sort_keys=True) for job in board.jobs}
            claimed = set(board.claims)
            try:
                yield board
            except BaseException as error:
                failure = error
            with self._transaction() as tx:
                self._write_board(tx, run_id, kind, board, before, claimed)
        finally:
            with self._transaction() as tx:
                tx.execute(
                    delete(shared_locks).where(
                        shared_locks.c.id == lock_id, shared_locks.c.owner == holder
                    )
                )
        if failure is not None:
            raise failure

    def _take_lock(self, lock_id: str, holder: str) -> None:
        while True:
            now = time.time()
            with self._transaction() as tx:
                dialect.lock(tx, f"hemra shared lock {lock_id}")  # the read and the take
                row = tx.execute(
                    select(shared_locks.c.owner, shared_locks.c.expires_at).where(
                        shared_locks.c.id == lock_id
                    )
                ).first()
                if (
                    row is None
                    or row.expires_at < now
                    or not is_alive(row.owner)
                    or row.owner == holder
                ):
                    dialect.upsert(
                        tx,
                        shared_locks,
                        {"id": lock_id, "owner": holder, "expires_at": now + LOCK_SECS},
                        ["id"],
                        update=True,
                    )
                    return
            time.sleep(LOCK_POLL_SECS)

    @staticmethod
    def _write_board(
        tx: Connection,
        run_id: str,
        kind: str,
        board: SharedBoard,
        before: dict[str, str],
        claimed: set[str],
    ) -> None:
        now = time.time()
        for seq, job in enumerate(board.jobs):
            data = json.dumps(job, sort_keys=True)
            if before.get(job["name"]) != data:
                dialect.upsert(
                    tx,
                    shared_jobs,
                    {
                        "id": f"{run_id}/{job['name']}",
                        "run_id": run_id,
                        "kind": kind,
                        "name": job["name"],
                        "seq": seq,
                        "data": data,
                        "updated_at": now,
                    },
                    ["id"],
                    update=True,
                )
        for key, trial in board.claims.items():
            if key not in claimed:
                dialect.upsert(
                    tx,
                    shared_claims,
                    {
                        "id": f"{run_id}/{key}",
                        "run_id": run_id,
                        "kind": kind,
                        "result": key,
                        "trial_id": trial,
                        "at": now,
                    },
                    ["id"],
                    update=False,
                )
