"""`hemra serve`: works the store's queue, one supervised pytest session per run.

Each run with queued jobs (or jobs whose runner is gone) is finished by a child
`pytest --hemra-resume RUN_ID -n N`, so a served run goes through exactly the same plugin as
`pytest --hemra-run`. Stopping the server kills its child and removes the child's sandboxes;
their leases are then held by a dead process, and the next server reclaims them. The child
reads its sandbox provider from the plug-in registry, as every pytest session does.

Before it starts a child for a run, the server checks its environment holds the variables the
run's harnesses name (`resolve.plan.harness_variables`): a harness it cannot run has its trials
left queued, the variable named; a run none of whose waiting trials it can run is not started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.store_location import STORE_VARIABLE
from pytest_hemra.resolve.plan import load_recorded, missing_variables
from pytest_hemra.run.job import run_provider
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive

POLL_SECS = 1.0
USAGE_EXITS = (2, 3, 4)  # interrupted, internal error, usage error: do not try the run again


def session_argv(run_id: str, concurrency: int | None) -> list[str]:
    """The pytest session that finishes one run: as many trials at once as the run says
    (its recorded `concurrency`), unless the server was told otherwise. Its store is handed
    over in `HEMRA_STORE` (`session_env`), where a URL's password is not on every `ps`."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN"]
    # it exits as `hemra run` would: 0 when every trial has a result, failing tasks included
    argv += ["--hemra-resume", run_id, "--hemra-fail-on", "unfinished"]
    return argv + (["--hemra-concurrency", str(concurrency)] if concurrency else [])


def session_env(store: Store) -> dict[str, str]:
    return {**os.environ, STORE_VARIABLE: store.address}


class Supervisor:
    def __init__(self, store: str | Path, concurrency: int | None) -> None:
        self.store = Store(store)
        self.concurrency = concurrency
        # sessions run in the store's folder (a server's store: the current folder)
        self.folder = Path.cwd() if self.store.path is None else self.store.path.parent
        self.logs = self.folder / "serve"
        self.stopping = False
        self.given_up: set[str] = set()
        self.told: set[tuple[str, str]] = set()  # (run, harness) lacking variables, said once
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
                if self._lacks_everything(runnable[0]):
                    self.given_up.add(runnable[0])
                    continue
                self._work(runnable[0])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0

    def _lacks_everything(self, run_id: str) -> bool:
        """Say which of the run's waiting harnesses need a variable this server lacks; True
        when that is every one of them (nothing here to run: its trials stay queued)."""
        try:
            run = load_recorded(self.store, run_id)
        except HemraError:
            return False  # the child says what is wrong, in its log
        waiting = {t.harness for t in run.trials if not t.is_finished}
        lacking = {
            harness: missing
            for harness in sorted(waiting)
            if (missing := missing_variables(run.harnesses[harness], run.spec))
        }
        for harness, missing in lacking.items():
            if (run_id, harness) not in self.told:
                self.told.add((run_id, harness))
                print(
                    f"hemra serve: run {run_id}: harness {harness!r} needs environment variable"
                    f" {missing[0]}, which this server lacks: its trials stay queued",
                    flush=True,
                )
        return bool(waiting) and lacking.keys() == waiting

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _work(self, run_id: str) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{run_id}.log"
        print(f"hemra serve: working run {run_id} (log {log_path})", flush=True)
        before = self.store.job_counts(run_id)
        with log_path.open("ab") as log:
            self.child = subprocess.Popen(
                session_argv(run_id, self.concurrency),
                cwd=self.folder,
                env=session_env(self.store),
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
            counted = ", ".join(f"{n} {state}" for state, n in counts.items())  # "12 done"
            print(f"hemra serve: run {run_id} done (exit {code}): {counted}", flush=True)
