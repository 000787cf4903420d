"""Many trials at once in one process: its lanes.

A trial mostly waits (on its model, its sandbox, its verifier), so a process need not be a
trial: it runs up to `size` trials at once, each on a thread of its own (a lane), and pytest's
items report them. Threads, not asyncio: a trial's work is the Docker SDK's and the store's
blocking calls, and the gateway already runs its own event loop in a thread of the process.

The lanes take the session's trials in collection order. An item waits for its trial's result
and reports it from the store, as it does without lanes; without pytest-xdist the items are
reported in the order their trials finish (`in_finish_order`). Under pytest-xdist every worker
has lanes of its own, each taking from the whole session (the store's claim gives each trial to
one of them), and a worker asked for an item whose trial a sibling runs waits for its result.

A retry (a new attempt after an infrastructure error) runs on the thread of the item that
asked for it. `stop` ends the lanes: trials not started are never started, running ones are
stopped and recorded cancelled, and it returns once every lane has recorded its trial.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from pytest_hemra.core.records import TrialRecord
from pytest_hemra.run.job import Runner
from pytest_hemra.store.owner import is_alive

POLL_SECS = 0.25  # how often an item whose trial another process runs reads the store


@dataclass
class Lanes:
    """A process's lanes on one run: `size` trials at once."""

    runner: Runner
    size: int
    futures: dict[str, Future[str | None]] = field(default_factory=dict)
    stopping: str | None = None  # why the lanes were stopped
    pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="hemra-lane")

    def start(self, trials: Sequence[TrialRecord]) -> Lanes:
        """Queue the trials in order: a lane takes the next as it comes free."""
        for trial in trials:
            if trial.id not in self.futures and not trial.is_finished:
                self.futures[trial.id] = self.pool.submit(self._work, trial)
        return self

    def _work(self, trial: TrialRecord) -> str | None:
        if self.stopping is not None:
            return f"hemra: {trial.id} not started: {self.stopping}"
        return self.runner.work(trial)

    def work(self, trial: TrialRecord) -> str | None:
        """`Runner.work` for an item: its trial's result is recorded (here or by another
        process of the session) when this returns None; otherwise the text says why not."""
        future = self.futures.get(trial.id)
        if future is None:
            note = self.runner.work(trial)
        elif future.cancelled():
            note = f"hemra: {trial.id} not started: {self.stopping}"
        else:
            note = future.result()
        if note is not None and self._wait_for_holder(trial):
            return None
        return note

    def _wait_for_holder(self, trial: TrialRecord) -> bool:
        """Wait while another live runner holds the trial's job; whether it then finished."""
        store = self.runner.store
        while True:
            detail = store.trial_detail(trial.id)
            if detail.trial.is_finished:
                return True
            if detail.job_state not in ("leased", "cancelling"):
                return False
            if detail.worker is None or not is_alive(detail.worker):
                return False
            time.sleep(POLL_SECS)

    def in_finish_order(self, trials: Sequence[TrialRecord]) -> Iterator[TrialRecord]:
        """The trials as their first attempts finish (those the lanes did not queue first)."""
        queued = {self.futures[t.id]: t for t in trials if t.id in self.futures}
        yield from (t for t in trials if t.id not in self.futures)
        for future in as_completed(queued):
            yield queued[future]

    def stop(self, reason: str) -> None:
        """No trial started after this; running ones stopped (recorded cancelled with
        `reason`); returns once each lane has recorded its trial."""
        if self.stopping is None:
            self.stopping = reason
            self.runner.stop_running(reason)
        self.pool.shutdown(wait=True, cancel_futures=True)
