"""`hemra worker` (and `hemra serve`, a worker plus the viewer): works the store's queue, one
supervised pytest session at a time.

Each run with queued jobs (or jobs whose runner is gone) is worked by a child
`pytest --hemra-resume RUN_ID`, so a worked run goes through exactly the same plugin as
`pytest --hemra-run`: its lanes, leases, retries, and the takeover of trials whose runner is
gone (`run/lanes.py`). Several workers, on one machine or many sharing a PostgreSQL store,
may work one run at once: each session claims the trials no one holds, and waits for (or
takes over) the others'. The child reads its sandbox provider from the plug-in registry and
its engine from the worker's environment (DOCKER_HOST), as every pytest session does.

Stopping a worker (SIGINT, SIGTERM) kills its child and hands its trials back: each is queued
again under a new row, its sandbox removed, for this or another worker to run at once. A
worker killed outright (SIGKILL, its machine lost) takes its child with it (the child dies
with its parent); its leases expire and the other workers take its trials over. What it left
on its engine is removed by the next worker that starts there.

Before it starts a child for a run, the worker checks its environment holds the variables the
run's harnesses name (`resolve.plan.harness_variables`): a harness it cannot run has its trials
left queued, the variable named; a run none of whose waiting trials it can run is not started.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.lifecycle import JobState
from pytest_hemra.core.progress import Progress
from pytest_hemra.core.store_location import STORE_VARIABLE
from pytest_hemra.execute.sandbox.providers import sandbox_provider
from pytest_hemra.resolve.plan import load_recorded, missing_variables
from pytest_hemra.resolve.spec import SandboxSettings
from pytest_hemra.run.job import run_provider
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive

POLL_SECS = 1.0
COUNT_SECS = 2.0  # how often a worked run's jobs are counted, for its progress
KILL_WAIT_SECS = 30.0  # a session killed with SIGKILL: how long its exit is waited for
USAGE_EXITS = (2, 3, 4)  # interrupted, internal error, usage error: do not try the run again
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def session_argv(run_id: str, concurrency: int | None) -> list[str]:
    """The pytest session that finishes one run: as many trials at once as the run says
    (its recorded `concurrency`), unless the server was told otherwise. Its store is handed
    over in `HEMRA_STORE` (`session_env`), where a URL's password is not on every `ps`."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN"]
    # it exits as `hemra run` would: 0 when every trial has a result, failing tasks included
    argv += ["--hemra-resume", run_id, "--hemra-fail-on", "unfinished"]
    return argv + (["--hemra-concurrency", str(concurrency)] if concurrency else [])


def _trials(counts: dict[str, int]) -> int:
    """A run's trials, from its jobs by state (a replaced row is its retry's, counted once)."""
    left_out = (JobState.REPLACED, JobState.DESELECTED)
    return sum(n for state, n in counts.items() if state not in left_out)


def _show(progress: Progress, counts: dict[str, int]) -> None:
    """A worked run's progress: its trials over (done or cancelled), those running and queued."""
    over = counts.get(JobState.DONE, 0) + counts.get(JobState.CANCELLED, 0)
    running = sum(counts.get(state, 0) for state in JobState.LIVE)
    queued = counts.get(JobState.QUEUED, 0)
    progress.update(over, f"{running} running, {queued} queued", total=_trials(counts))


def session_env(store: Store) -> dict[str, str]:
    return {**os.environ, STORE_VARIABLE: store.address}


def _prctl() -> Callable[..., int] | None:
    """prctl(2), looked up before any child is forked (Linux; elsewhere None)."""
    try:
        found: Callable[..., int] = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None
    return found


PRCTL = _prctl()


def die_with_parent() -> None:
    """In the child, between fork and exec: SIGKILL when the worker dies, however it dies. It
    calls only what was looked up before the fork (the worker has threads: the viewer's)."""
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL))


class Worker:
    """Works the store's queue (every runnable run, or `run_id`'s alone), one session at once."""

    def __init__(
        self,
        store: str | Path,
        concurrency: int | None,
        run_id: str | None = None,
        name: str = "hemra worker",
    ) -> None:
        self.store = Store(store)
        self.concurrency = concurrency
        self.run_id = run_id
        self.name = name  # what its lines start with
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
            self._sweep()
            idle = False
            while not self.stopping:
                runnable = [
                    run_id
                    for run_id in self.store.runnable_runs(is_alive)
                    if run_id not in self.given_up and self.run_id in (None, run_id)
                ]
                if not runnable:
                    if once:
                        break
                    if not idle:  # said once each time the queue empties, not every poll
                        print(f"{self.name}: the queue is empty; waiting for runs", flush=True)
                        idle = True
                    time.sleep(POLL_SECS)
                    continue
                idle = False
                if self._lacks_everything(runnable[0]):
                    self.given_up.add(runnable[0])
                    continue
                self._work(runnable[0])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.store.close()
        return 0

    def _sweep(self) -> None:
        """What trials of this store that are over left on this worker's engine (DOCKER_HOST),
        removed: a worker killed here before, its trials since taken over elsewhere. The
        default sandbox provider's (`[sandbox]` with nothing set)."""
        provider = sandbox_provider(SandboxSettings())
        if provider.engine_error() is not None:
            return  # no engine here: its sessions say so, per run
        with contextlib.suppress(HemraError):
            removed = provider.remove_leftovers(lambda t: self.store.is_trial_over(t, is_alive))
            if removed:
                print(f"{self.name}: removed {removed} sandboxes of trials that are over")

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
                    f"{self.name}: run {run_id}: harness {harness!r} needs environment variable"
                    f" {missing[0]}, which this worker lacks: its trials stay queued",
                    flush=True,
                )
        return bool(waiting) and lacking.keys() == waiting

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _work(self, run_id: str) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{run_id}.log"
        print(f"{self.name}: working run {run_id} (log {log_path})", flush=True)
        before = self.store.job_counts(run_id)
        progress = Progress(f"run {run_id}", total=_trials(before), unit="trials over")
        with log_path.open("ab") as log, progress:
            self.child = subprocess.Popen(
                session_argv(run_id, self.concurrency),
                cwd=self.folder,
                env=session_env(self.store),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
            last_count = time.monotonic()
            while self.child.poll() is None:
                if time.monotonic() - last_count >= COUNT_SECS:  # how far along, for its progress
                    last_count = time.monotonic()
                    _show(progress, self.store.job_counts(run_id))
                if self.stopping:
                    os.killpg(self.child.pid, signal.SIGKILL)
                    try:  # a killed process is gone at once, unless stuck in the kernel
                        self.child.wait(timeout=KILL_WAIT_SECS)
                    except subprocess.TimeoutExpired:
                        stuck = f"session {self.child.pid} outlived SIGKILL for {KILL_WAIT_SECS:g}s"
                        print(f"{self.name}: {stuck}; its trials are handed back anyway")
                    handed = self._hand_back(run_id)
                    print(f"{self.name}: stopped; {handed} trials of run {run_id} queued again")
                    return
                time.sleep(0.2)
            _show(progress, self.store.job_counts(run_id))
        code = self.child.returncode
        after = self.store.job_counts(run_id)
        held = sum(after.get(state, 0) for state in JobState.LIVE)  # by other workers
        if code in USAGE_EXITS or (after == before and not held):
            self.given_up.add(run_id)
            print(f"{self.name}: run {run_id} made no progress (exit {code}); see {log_path}")
        else:
            counted = ", ".join(f"{n} {state}" for state, n in after.items())  # "12 done"
            print(f"{self.name}: run {run_id} done (exit {code}): {counted}", flush=True)

    def _hand_back(self, run_id: str) -> int:
        """The trials the killed session held, queued again under new rows (for any worker to
        run now, not when their leases expire), their sandboxes removed."""
        provider = run_provider(self.store, run_id)
        handed = 0
        for trial in self.store.stale_trials(run_id, is_alive):
            if self.store.take_over(trial, is_alive) is not None:
                handed += 1
                with contextlib.suppress(HemraError):  # its engine down: swept when back
                    provider.remove_sandboxes({"hemra.trial": trial})
        return handed
