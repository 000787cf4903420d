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

An item's trial may be another runner's (a worker of the same run on another machine, a
sibling under xdist): the item waits while that runner lives, and reports its result. When that
runner is gone (its lease expired, or its process seen dead on this host), this process takes
the trial over (`settle`): a new row, run here, whose result the item reports; every trial of
the run such a runner held is taken over at once, each on a lane. One item, one result.

A retry (a new attempt after an infrastructure error) is queued on the lanes by the lane whose
trial failed, as soon as it fails: retries run as many at once as first attempts, never one
after another on the items' thread (which, without pytest-xdist, is pytest's main loop). The
item still reports the failed attempt as a rerun, then follows its retry. `stop` ends the
lanes: trials not started are never started, running ones are stopped and recorded cancelled,
and it returns once every lane has recorded its trial.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from pytest_hemra.core.errors import InfraError
from pytest_hemra.core.lifecycle import JobState
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.run.job import Runner
from pytest_hemra.store.owner import is_alive

POLL_SECS = 0.25  # how often an item whose trial another process runs reads the store
# how long an item waits for its trial once a lane has started it (the trial's own limits, the
# agent's and the verifier's, end it long before; this catches a lane that never returns)
LANE_WAIT_SECS = 24 * 3600.0


@dataclass
class Lanes:
    """A process's lanes on one run: `size` trials at once."""

    runner: Runner
    size: int
    futures: dict[str, Future[str | None]] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)  # when a lane took each trial
    retried: set[str] = field(default_factory=set)  # trials whose retry a lane queued
    stopping: str | None = None  # why the lanes were stopped
    pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="hemra-lane")

    def start(self, trials: Sequence[TrialRecord]) -> Lanes:
        """Queue the trials in order: a lane takes the next as it comes free."""
        for trial in trials if self.stopping is None else ():
            if trial.id not in self.futures and not trial.is_finished:
                self.futures[trial.id] = self.pool.submit(self._work, trial)
        return self

    def _work(self, trial: TrialRecord) -> str | None:
        self.started[trial.id] = time.monotonic()
        if self.stopping is not None:
            return f"hemra: {trial.id} not started: {self.stopping}"
        note = self.runner.work(trial)
        self._queue_retry(trial)
        return note

    def _queue_retry(self, trial: TrialRecord) -> None:
        """A trial that ended in an infrastructure error with retries left: its new attempt
        queued on the lanes now (the item that reports it follows it there)."""
        record = self.runner.store.trial(trial.id)
        if self.stopping is not None or record.outcome != Outcome.INFRA_ERROR:
            return
        retry = self.runner.next_attempt(record)
        if retry is None or self.stopping is not None:
            return
        self.retried.add(trial.id)
        try:
            self.futures[retry.id] = self.pool.submit(self._work, retry)
        except RuntimeError:  # the lanes shut down meanwhile: the item runs it, or resume does
            self.retried.discard(trial.id)

    def work(self, trial: TrialRecord) -> TrialRecord | str:
        """An item's trial to its result: the row that holds it (the trial's own, or the one
        that took it over), or a text saying why it has none."""
        return settle(
            self.runner,
            trial,
            self._in_lane,
            wait=True,
            on_stale=self._take_over_all,
            retried=self.retried,
        )

    def _in_lane(self, trial: TrialRecord) -> str | None:
        """`Runner.work` for an item: on its lane when the lanes queued the trial, else (a
        retry, a row made as another runner's trial was taken over) on the item's thread."""
        future = self.futures.get(trial.id)
        if future is None:
            return self._work(trial)
        if future.cancelled():
            return f"hemra: {trial.id} not started: {self.stopping}"
        return self._result(trial.id, future)

    def _result(self, trial_id: str, future: Future[str | None]) -> str | None:
        """The lane's answer for a trial: waited for while the trial is queued behind others
        (each with its own deadline), and for LANE_WAIT_SECS once a lane has started it."""
        while True:
            try:
                return future.result(timeout=POLL_SECS)
            except TimeoutError:
                started = self.started.get(trial_id)
                if started is not None and time.monotonic() - started > LANE_WAIT_SECS:
                    raise InfraError(
                        f"hemra: {trial_id}: its lane did not finish it in {LANE_WAIT_SECS:g}s"
                    ) from None

    def _take_over_all(self) -> bool:
        """Every trial of the run a gone runner held, taken over and queued on the lanes;
        whether there was any."""
        runner = self.runner
        taken = [
            runner.take_over(stale) for stale in runner.store.stale_trials(runner.run.id, is_alive)
        ]
        self.start([replacement for replacement in taken if replacement is not None])
        return any(taken)

    def in_finish_order(self, trials: Sequence[TrialRecord]) -> Iterator[TrialRecord]:
        """The trials as their first attempts finish (those the lanes did not queue first)."""
        queued = {self.futures[t.id]: t for t in trials if t.id in self.futures}
        yield from (t for t in trials if t.id not in self.futures)
        try:
            for future in as_completed(queued, timeout=LANE_WAIT_SECS):
                yield queued.pop(future)
        except TimeoutError:  # none finished in that long: each is then waited for by its own
            yield from queued.values()  # deadline (`_result`), in the plan's order

    def stop(self, reason: str, *, running: bool = True) -> None:
        """No trial started after this; running ones stopped (recorded cancelled with
        `reason`), or with `running=False` let finish; returns once each lane has recorded
        its trial. An xdist worker whose items are done finishes, not stops: its lanes may be
        running trials of a sibling's items, which wait for them."""
        if self.stopping is None:
            self.stopping = reason
            if running:
                self.runner.stop_running(reason)
        self.pool.shutdown(wait=True, cancel_futures=True)


def settle(
    runner: Runner,
    trial: TrialRecord,
    run: Callable[[TrialRecord], str | None],
    *,
    wait: bool,
    on_stale: Callable[[], bool] | None = None,
    retried: Container[str] = (),
) -> TrialRecord | str:
    """A trial to its result: `run` (`Runner.work`, here or on a lane) claims and runs it; a
    trial another runner holds is waited for while that runner lives (with `wait`; else the
    text says it runs elsewhere), taken over when it is gone (`on_stale` first: every trial
    it held taken over at once), and followed to the row that replaced it. Returns the row
    with the trial's result, or a text saying why it has none (deselected, left queued,
    stopped). A row whose retry a lane queued (`retried`) is returned as it ended, for the
    item to report it as a rerun and follow its retry (`Runner.next_attempt` gives the row the
    lane made)."""
    store = runner.store
    current = trial
    note = run(current)
    while True:
        detail = store.trial_detail(current.id)
        if detail.trial.is_finished:
            return detail.trial
        state = detail.job_state
        if state == JobState.REPLACED:
            if current.id in retried and detail.trial.outcome == Outcome.INFRA_ERROR:
                return detail.trial
            following = store.replacement(current.id)
            if following is None:
                return note or f"hemra: {current.id} was replaced, and its new row is gone"
            current = following
            note = None
        elif state == JobState.QUEUED:
            before, note = note, run(current)
            if note is not None and note == before:
                return note  # left queued, or not started: this runner will not run it
        elif state in JobState.LIVE:
            if (on_stale is not None and on_stale()) or runner.take_over(current.id):
                continue  # its runner is gone: the new row is followed
            if not wait:
                return note or f"hemra: {current.id} is running in another runner"
            time.sleep(POLL_SECS)
        else:
            return note or f"hemra: {current.id} was {state}"
