"""Shared jobs: jobs a harness kind runs for several trials at once (Harbor's `harbor run`).

Each trial still claims its own job in the queue; the trials a shared job serves agree on
which jobs were started and which trial took which of their results through one board per
run and kind, read and written back in one write transaction, so items in other workers or in
a later resume see the same board. A job is the kind's own record (JSON); a claim is a result
key (unique in the run) and the trial that took it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pytest_hemra.store.base import StoreBase


@dataclass
class SharedBoard:
    """A run's shared jobs of one kind, in the order started, and their results' claims."""

    jobs: list[dict[str, Any]] = field(default_factory=list)  # each has a unique "name"
    claims: dict[str, str] = field(default_factory=dict)  # result key -> trial id


class SharedJobStore(StoreBase):
    """The boards of shared jobs."""

    def shared_board(self, run_id: str, kind: str) -> SharedBoard:
        """The board as it is now (read only)."""
        jobs = [
            json.loads(row[0])
            for row in self.db.execute(
                "SELECT data FROM shared_jobs WHERE run_id = ? AND kind = ? ORDER BY seq",
                [run_id, kind],
            )
        ]
        claims = {
            str(row[0]): str(row[1])
            for row in self.db.execute(
                "SELECT result, trial_id FROM shared_claims WHERE run_id = ? AND kind = ?",
                [run_id, kind],
            )
        }
        return SharedBoard(jobs, claims)

    @contextmanager
    def locked_shared_board(self, run_id: str, kind: str) -> Iterator[SharedBoard]:
        """The board, changed in place by the caller and written back, under the store's write
        lock: other processes' readers go on, their writers wait. What changed is written even
        when the caller fails (a job started before a failure stays on the board)."""
        failure: BaseException | None = None
        with self._transaction() as tx:
            board = self.shared_board(run_id, kind)
            before = {job["name"]: json.dumps(job, sort_keys=True) for job in board.jobs}
            claimed = set(board.claims)
            try:
                yield board
            except BaseException as error:
                failure = error
            now = time.time()
            for seq, job in enumerate(board.jobs):
                data = json.dumps(job, sort_keys=True)
                if before.get(job["name"]) != data:
                    tx.execute(
                        "INSERT INTO shared_jobs (id, run_id, kind, name, seq, data, updated_at)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET seq ="
                        " excluded.seq, data = excluded.data, updated_at = excluded.updated_at",
                        [f"{run_id}/{job['name']}", run_id, kind, job["name"], seq, data, now],
                    )
            tx.executemany(
                "INSERT OR IGNORE INTO shared_claims (id, run_id, kind, result, trial_id, at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (f"{run_id}/{key}", run_id, kind, key, trial, now)
                    for key, trial in board.claims.items()
                    if key not in claimed
                ],
            )
        if failure is not None:
            raise failure
