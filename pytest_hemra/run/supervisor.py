"""`hemra serve`: works the store's queue, one supervised pytest session per run.

Each run with queued jobs (or jobs whose runner is gone) is finished by a child
`pytest --hemra-resume RUN_ID -n N`, so a served run goes through exactly the same plugin as
`pytest --hemra-run`. Stopping the server kills its child and removes the child's sandboxes;
their leases are then held by a dead process, and the next server reclaims them. The child
reads its sandbox provider from the plug-in registry, as every pytest session does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from pytest_hemra.run.job import run_provider
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive

POLL_SECS = 1.0
USAGE_EXITS = (2, 3, 4)  # interrupted, internal error, usage error: do not try the run again


def session_argv(run_id: str, store: Path, concurrency: int) -> list[str]:
    """The pytest session that finishes one run."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN"]
    argv += ["--hemra-resume", run_id, "--hemra-store", str(store)]
    return argv + (["-n", str(concurrency)] if concurrency > 1 else [])


class Supervisor:
    def __init__(self, store_path: Path, concurrency: int) -> None:
        self.store_path = store_path.resolve()
        self.store = Store(self.store_path)
        self.concurrency = concurrency
        self.logs = self.store_path.parent / "serve"
        self.stopping = False
        self.given_up: set[str] = set()
        self.child: subprocess.Popen[bytes] | None = None

    def serve(self, *, once: bool = False) -> int:
        """Work runs until stopped (SIGINT, SIGTERM); with `once`, until the queue is empty."""
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self.stopping:
                runnable = [
                    run_id
                    for run_id in self.store.runnable_runs(is_alive)
                    if run_id not in self.given_up
                ]
                if not runnable:
                    if once:
                        break
                    time.sleep(POLL_SECS)
                    continue
                self._work(runnable[0])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _work(self, run_id: str) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{run_id}.log"
        print(f"hemra serve: working run {run_id} (log {log_path})", flush=True)
        before = self.store.job_counts(run_id)
        with log_path.open("ab") as log:
            self.child = subprocess.Popen(
                session_argv(run_id, self.store_path, self.concurrency),
                cwd=self.store_path.parent,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            while self.child.poll() is None:
                if self.stopping:
                    os.killpg(self.child.pid, signal.SIGKILL)
                    self.child.wait()
                    run_provider(self.store, run_id).remove_sandboxes({"hemra.run": run_id})
                    print(f"hemra serve: stopped; run {run_id} resumes on the next serve")
                    return
                time.sleep(0.2)
        code = self.child.returncode
        if code in USAGE_EXITS or self.store.job_counts(run_id) == before:
            self.given_up.add(run_id)
            print(f"hemra serve: run {run_id} made no progress (exit {code}); see {log_path}")
        else:
            counts = self.store.job_counts(run_id)
            print(f"hemra serve: run {run_id} done (exit {code}): {counts}", flush=True)
