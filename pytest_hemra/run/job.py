"""Working a recorded run's jobs in one process: claim a trial's job, beat its lease while the
trial runs, record its result (or its cancellation), and start the next attempt after an
infrastructure error. The pytest face calls it from each item; `hemra serve` runs the same
pytest session, so both work jobs through this one `Runner`.

A `Runner` also owns what every trial of the process shares: the sandbox provider and the
gateway (started on first use, stopped by `close`).

Before it claims a trial, a runner checks that its own environment holds every variable the
trial's harness needs (`resolve.plan.harness_variables`): a worker started without a key (a
`hemra serve` child, an xdist worker, a `--hemra-resume` session) leaves the trial queued for
a runner that has it, rather than running it into the upstream's 401 and a scored `fail`.

A runner waits out what is not a trial's own doing (`run/outage.py`): its engine not answering,
before a trial and after an infrastructure error (the trial then runs again without using up a
retry), and a store it cannot write for now (its disk full, its lock held by another process).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from pytest_hemra.core.backoff import engine_backoff, engine_settle_secs
from pytest_hemra.core.errors import (
    HemraError,
    StoreUnavailable,
)
from pytest_hemra.core.events import ENGINE_BUSY, ENGINE_KEPT
from pytest_hemra.core.lifecycle import TAKEN, JobState, RunStatus
from pytest_hemra.core.outcome import Cause, Outcome
from pytest_hemra.core.records import UPSTREAM_REFUSED, TrialRecord
from pytest_hemra.core.trial import TrialResult
from pytest_hemra.execute.context import TrialContext
from pytest_hemra.execute.gateway.ledger import Budgets, RunBudget
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.kinds import kind_of
from pytest_hemra.execute.provisioning import ProviderFactory
from pytest_hemra.execute.sandbox import SandboxProvider
from pytest_hemra.execute.sandbox.client import LOCAL_ENGINE
from pytest_hemra.execute.sandbox.health import is_engine_fault
from pytest_hemra.execute.sandbox.images import hold_engine_locks_in
from pytest_hemra.execute.sandbox.providers import sandbox_provider
from pytest_hemra.resolve.plan import RecordedRun, missing_variables
from pytest_hemra.resolve.spec import RunSpec, SandboxSettings
from pytest_hemra.resolve.upstreams import configured_upstreams
from pytest_hemra.run.admission import admission
from pytest_hemra.run.lease import LEASE_SECS, Heartbeat
from pytest_hemra.run.outage import EngineWatch, durably
from pytest_hemra.run.trial import run_trial
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive, owner_name

T = TypeVar("T")
MAX_OUTAGE_RERUNS = 5  # a trial run again this often for outages: the next counts as a retry


def sandbox_for(
    spec: RunSpec, store: Store | None, found: dict[str, ProviderFactory] | None = None
) -> SandboxProvider:
    """The run's sandbox provider, from the plug-in registry (or `found`, when already read):
    a pool of its `[[sandbox.engines]]` when it names some."""
    return sandbox_provider(spec.sandbox, found, store=store, owner=owner_name())


def run_provider(store: Store, run_id: str) -> SandboxProvider:
    """The sandbox provider a recorded run names (`hemra cancel`, `hemra serve`, the viewer's
    cancel): read from its `[sandbox]` table alone, so any recorded run can be cancelled."""
    settings = SandboxSettings.model_validate(store.run(run_id).plan.settings.get("sandbox") or {})
    return sandbox_provider(settings, store=store, owner=owner_name())


@dataclass
class Runner:
    """One process's share of a recorded run: its jobs, sandboxes and gateway."""

    store: Store
    run: RecordedRun
    provider: SandboxProvider
    worker: str
    gateway: Gateway | None = None
    gateway_host: str = "127.0.0.1"
    budget: RunBudget | None = None
    cell_budgets: dict[str, RunBudget] = field(default_factory=dict)  # cell -> its budget
    watch: EngineWatch | None = None  # made on first use (its bounds read from the environment)
    store_lost: str | None = None  # the store could not be written within its give-up total
    # what the threads of a process running several trials at once (`run/lanes.py`) make once
    _once: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _beats: dict[str, Heartbeat] = field(default_factory=dict, repr=False)  # running trials
    # handles on the store of its own threads (the gateway's writer, budgets): closed by `close`
    _stores: list[Store] = field(default_factory=list, repr=False)
    _closing: threading.Thread | None = field(default=None, repr=False)  # `close_soon`'s
    _close_error: BaseException | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.store.is_server:  # runners on several machines: the engine's locks in the store
            hold_engine_locks_in(self.store.lock)

    def _opened(self, store: Store) -> Store:
        self._stores.append(store)
        return store

    def started_gateway(self) -> Gateway:
        """This process's gateway, started on first use: loopback plus where sandboxes reach."""
        with self._once:
            return self._started_gateway()

    def _started_gateway(self) -> Gateway:
        if self.gateway is None:
            host = self.provider.gateway_host()
            hosts = ["127.0.0.1", *([host] if host and host != "127.0.0.1" else [])]
            hosts = list(dict.fromkeys([*hosts, *self.provider.gateway_hosts()]))  # a pool's
            writer = self._opened(Store(self.store.address))  # the gateway writer's own
            upstreams = configured_upstreams(self.run.spec.providers)
            self.gateway = Gateway(upstreams, writer.record_call, hosts).start()
            self.gateway_host = host or "127.0.0.1"
            if self.run.spec.budget_usd is not None:
                reader, run_id = self._opened(Store(self.store.address)), self.run.id
                self.budget = RunBudget(self.run.spec.budget_usd, lambda: reader.run_cost(run_id))
        return self.gateway

    def _budgets(self, trial: TrialRecord) -> Budgets | None:
        """The budgets a trial's calls must fit in: the run's `budget_usd` and its cell's
        `cell_budget_usd` (a harness, or a harness x model pair), each read from the store."""
        budgets = [self.budget] if self.budget is not None else []
        limit = self.run.spec.cell_budget_usd
        if limit is not None:
            with self._once:
                self._cell_budget(trial, limit)
            budgets.append(self.cell_budgets[trial.cell])
        return Budgets(budgets) if budgets else None

    def _cell_budget(self, trial: TrialRecord, limit: float) -> None:
        if trial.cell not in self.cell_budgets:
            reader, run_id = self._opened(Store(self.store.address)), self.run.id
            harness, model = trial.harness, trial.model
            self.cell_budgets[trial.cell] = RunBudget(
                limit, lambda: reader.cell_cost(run_id, harness, model), "cell budget"
            )

    def work(self, trial: TrialRecord) -> str | None:
        """Claim the trial's job and, once leased, run the trial to a recorded result (read it
        with `store.trial`). A finished trial is left alone; a job another runner holds, or
        has replaced or deselected, is not run: the returned text says so."""
        if self.store_lost is not None:
            raise StoreUnavailable(self.store_lost)
        if trial.is_finished:
            return None
        missing = missing_variables(self.run.harnesses[trial.harness], self.run.spec)
        if missing:  # not claimed: the job stays queued for a runner that has the variable
            return (
                f"hemra: {trial.id} left queued: harness {trial.harness!r} needs environment "
                f"variable {missing[0]}, which this runner's environment lacks"
            )
        claim = self._durably(lambda: self.store.claim(trial.id, self.worker, LEASE_SECS), trial)
        if claim.is_leased:
            self._run(trial)
        elif claim.state in (TAKEN, JobState.CANCELLING):
            return f"hemra: {trial.id} is running in another runner"
        elif claim.state in (JobState.REPLACED, JobState.DESELECTED):
            return f"hemra: {trial.id} was {claim.state} by another runner"
        return None

    def take_over(self, trial: str) -> TrialRecord | None:
        """A running trial whose runner is gone (its lease expired, or its process seen dead
        on this host), resumed under a new row queued for this runner (`run/lanes.settle`
        runs it), what that runner left on this runner's engine removed. None when its runner
        may still live, or the trial is not running any more."""
        replacement = self.store.take_over(trial, is_alive)
        if replacement is not None:
            with contextlib.suppress(HemraError):  # its engine down: swept when it is back
                self.provider.remove_sandboxes({"hemra.trial": trial})
        return replacement

    def _run(self, trial: TrialRecord) -> None:
        store = self.store
        trial_dir = self.run.trials_dir / trial.dataset / trial.task / folder_name(trial)

        def stop_sandbox() -> None:
            self.provider.remove_sandboxes({"hemra.trial": trial.id})

        with Heartbeat(store.address, trial.id, self.worker, stop_sandbox) as beat:
            with self._once:
                self._beats[trial.id] = beat
            try:
                result = self._run_waiting(trial, trial_dir, beat.cancelled)
            except KeyboardInterrupt:
                store.cancel_trials([trial.id], "interrupted (Ctrl-C)")
                raise
            finally:
                with self._once:
                    self._beats.pop(trial.id, None)
        if beat.cancelled.is_set() or store.job_state(trial.id) == JobState.CANCELLING:
            result = replace(result, outcome=Outcome.CANCELLED, reward=None, error=beat.reason)
        elif result.is_scored:
            result = self._with_upstream_refusals(trial, result)
        self._durably(lambda: store.finish_trial(trial.id, result), trial)

    def _run_waiting(
        self, trial: TrialRecord, trial_dir: Path, cancelled: threading.Event
    ) -> TrialResult:
        """The trial, its engine waited for first when it does not answer; an infrastructure
        error after which the engine does not answer, or that was the engine's (it could not
        be reached, or went away just after: `run_trial` says), is the engine's outage: waited
        out, and classed so the trial runs again without using up a retry."""
        watch, run_id = self._engine_watch(), self.run.id
        down = watch.error()
        if down is not None:
            waited = watch.wait(run_id, trial.id, cancelled, down)
            if not waited.is_back:
                return _failed(trial_dir, waited.note(), Cause.ENGINE_GONE)
        started = time.monotonic()
        try:
            context = replace(self._context(trial, trial_dir), stopped=cancelled)
        except HemraError as error:  # its task's files changed, the gateway cannot listen...
            outage = Cause.ENGINE_OUTAGE if is_engine_fault(error) else None
            result = _failed(trial_dir, str(error), outage)
        else:
            result = self._run_kind(context, trial)
        if result.outcome != Outcome.INFRA_ERROR or result.cause == Cause.RUNNER_DISK_FULL:
            return result
        if result.cause == Cause.ENGINE_BUSY:  # it answers: nothing to wait for
            self._record_busy(trial, result)
            return result
        down = None if cancelled.is_set() else watch.error(result.engine)
        went = result.cause == Cause.ENGINE_OUTAGE or watch.was_down_since(started)
        if down is None and not went:
            return result  # its engine was reached and answered throughout: its own fault
        waited = watch.wait(run_id, trial.id, cancelled, down or result.error, result.engine)
        if waited.is_cancelled:
            return result
        cause = Cause.ENGINE_OUTAGE if waited.is_back else Cause.ENGINE_GONE
        return replace(result, cause=cause, error=f"{waited.note()}: {result.error}")

    def _record_busy(self, trial: TrialRecord, result: TrialResult) -> None:
        """`engine_busy`: the engine, answering pings, answered the trial's start too late;
        with how many starts this process now lets be in flight there."""
        engine = result.engine or self.provider.engine or LOCAL_ENGINE
        data = {"engine": engine, "starts": int(admission(engine).limit), "error": result.error}
        with contextlib.suppress(StoreUnavailable):  # the trial's own row says it too
            durably(
                self.store,
                lambda: self.store.record_event(self.run.id, trial.id, ENGINE_BUSY, data),
            )

    def _engine_watch(self) -> EngineWatch:
        """The process's watch on its engine, made (and what earlier runs of this store left on
        the engine swept) before its first trial."""
        with self._once:
            if self.watch is None:
                watch = EngineWatch(
                    self.provider, self.store, engine_backoff(), engine_settle_secs()
                )
                watch.sweep()
                # what the engine kept that the sweep could not remove, for `hemra runs` and
                # the viewer (none: said too, the last runner's start is what they show)
                kept = {"stuck": self.provider.kept()}
                with contextlib.suppress(StoreUnavailable):
                    durably(
                        self.store,
                        lambda: self.store.record_event(self.run.id, None, ENGINE_KEPT, kept),
                    )
                self.watch = watch.start()
            return self.watch

    def _context(self, trial: TrialRecord, trial_dir: Path) -> TrialContext:
        """What the trial runs with; its task's files are read again (they may have changed
        since the run was recorded: a link out), and the process's gateway started."""
        run = self.run
        task = run.task(trial)
        return TrialContext(
            run_id=run.id,
            trial_id=trial.id,
            task=task,
            harness=run.harnesses[trial.harness],
            spec=run.spec
            if trial.model is None
            else run.spec.model_copy(
                update={"model": trial.model}
            ),  # a matrix run's cell: its model is the one the harness must use
            provider=self.provider,
            gateway=self.started_gateway(),
            gateway_host=self.gateway_host,
            budget=self._budgets(trial),
            judges=run.judges,
            trial_dir=trial_dir,
            pool=self.provider.placement(),
            dataset=trial.dataset,
        )

    def _durably(self, write: Callable[[], T], trial: TrialRecord) -> T:
        """A store write, its full disk or held lock waited out; given up on, the store is
        lost to this process: it runs no more trials (`--resume` finishes the run)."""
        try:
            return durably(self.store, write, where=(self.run.id, trial.id))
        except StoreUnavailable as error:
            self.store_lost = f"{error}; `hemra run --resume {self.run.id}` finishes the run"
            raise StoreUnavailable(self.store_lost) from error

    def _with_upstream_refusals(self, trial: TrialRecord, result: TrialResult) -> TrialResult:
        """A scored trial some of whose agent calls the real upstream answered 401/403 (the
        runner's key refused, not the harness's doing) keeps its outcome, its error saying so
        (reports flag it). Not made an infra error: an agent could provoke a refusal (a header
        the upstream rejects) to have a failing trial dropped from the comparison."""
        calls = [c for c in self.store.calls(trial=trial.id) if c.role == "agent"]
        refused = [c for c in calls if c.status in (401, 403) and not c.refused]
        if not refused:
            return result
        statuses = "/".join(sorted({str(c.status) for c in refused}))
        upstreams = configured_upstreams(self.run.spec.providers)
        spec = self.run.harnesses[trial.harness].spec
        keys = {
            spec.key_env if spec.key_env and c.provider == spec.provider else upstream.key_env
            for c in refused
            if (upstream := upstreams.get(c.provider or "")) is not None
        }
        names = ", ".join(sorted(k for k in keys if k))
        note = f"{UPSTREAM_REFUSED} ({statuses}) on {len(refused)} of {len(calls)} model calls"
        note += f" (check {names})" if names else " (check the provider's key)"
        return replace(result, error=f"{note}; {result.error}" if result.error else note)

    def _run_kind(self, context: TrialContext, trial: TrialRecord) -> TrialResult:
        """The trial by its kind when the kind runs whole trials itself (Harbor's jobs), else
        in HEMRA's own sandbox."""
        own = kind_of(context.harness).run_trial(context, self.run, self.store, trial)
        return run_trial(context) if own is None else own

    def stop_running(self, reason: str) -> None:
        """Stop every trial this process runs: each is recorded cancelled, with `reason`."""
        with self._once:
            beats = list(self._beats.values())
        for beat in beats:
            beat.stop(reason)

    def next_attempt(self, record: TrialRecord) -> TrialRecord | None:
        """After an infrastructure error with retries left, the row that runs the trial again
        (a new attempt); after an outage the runner waited out, one that uses up no retry (up
        to MAX_OUTAGE_RERUNS times); otherwise (the run cancelled meanwhile, its engine given
        up on, the store lost) None."""
        if record.outcome != Outcome.INFRA_ERROR or record.cause == Cause.ENGINE_GONE:
            return None
        cause = record.cause if record.cause in Cause.WAITED_OUT else None
        if cause is not None and self._outages(record) > MAX_OUTAGE_RERUNS:
            cause = None
        if cause is None and record.retries >= self.run.spec.max_infra_retries:
            return None
        try:
            if self.store.run(self.run.id).status in RunStatus.STOPPED:
                return None
            return self._durably(
                lambda: self.store.replace_trial(record.id, retry=True, cause=cause), record
            )
        except StoreUnavailable:
            return None  # recorded infra_error: `--resume` runs it again

    def _outages(self, record: TrialRecord) -> int:
        """How many rows of the trial, this one and those it replaces, ended in an outage."""
        count, current = 0, record
        while True:
            count += current.cause in Cause.WAITED_OUT
            if current.replaces is None:
                return count
            current = self.store.trial(current.replaces)

    def close_soon(self) -> None:
        """Begin `close` on a thread of its own, the process's trials all over: the run's
        network is released and the gateway stopped while the session's report is made (the
        engine's removal of a network takes a few tenths of a second); `close` waits for it,
        and raises what it raised."""
        if self._closing is None:
            self._closing = threading.Thread(target=self._close_catching, name="hemra-close")
            self._closing.start()

    def _close_catching(self) -> None:
        try:
            self._close_now()
        except BaseException as error:  # raised again by `close`, in the session's thread
            self._close_error = error

    def close(self) -> None:
        if self._closing is None:
            self._close_now()
            return
        self._closing.join()
        error, self._close_error = self._close_error, None
        if error is not None:
            raise error

    def _close_now(self) -> None:
        if self.store.is_server:
            hold_engine_locks_in(None)
        if self.watch is not None:
            self.watch.stop()
        if self.gateway is not None:
            url = self.gateway.base_urls.get(self.gateway_host)
            proxy = self.gateway.egress.urls.get(self.gateway_host)
            ports = [urlsplit(found).port for found in (url, proxy) if found]
            with contextlib.suppress(HemraError):  # gone already: reaped by the next runner
                self.provider.release(self.run.id, [port for port in ports if port is not None])
            self.gateway.stop()  # after: while it holds its ports, no other runner is given one
            self.gateway = None
        while self._stores:  # after the gateway: its writer writes until it stops
            self._stores.pop().close()


def _failed(trial_dir: Path, error: str, cause: Cause | None = None) -> TrialResult:
    """An infra_error result for a trial that did not start."""
    now = time.time()
    return TrialResult(
        outcome=Outcome.INFRA_ERROR, reward=None, rewards={}, exit_code=None, error=error,
        started_at=now, finished_at=now, duration=0.0, phases={}, trial_dir=str(trial_dir),
        cause=cause,
    )  # fmt: skip


def folder_name(trial: TrialRecord) -> str:
    """`harness-attempt` (`harness@model-attempt` in a matrix run, the model's `/` and other
    characters a path cannot hold as `_`); a row that ran a trial again (a retry, a resume)
    adds its seq."""
    name = re.sub(r"[^A-Za-z0-9._@-]", "_", f"{trial.cell}-{trial.attempt}")
    return f"{name}.{trial.seq}" if trial.replaces else name
