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
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import asdict, dataclass, field, replace
from urllib.parse import urlsplit

from pytest_hemra.core import registry
from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import UPSTREAM_REFUSED, TrialRecord
from pytest_hemra.execute.context import TrialContext, TrialResult
from pytest_hemra.execute.gateway.ledger import Budgets, RunBudget
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.kinds import kind_of
from pytest_hemra.execute.provisioning import ProviderFactory
from pytest_hemra.execute.sandbox import SandboxProvider
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.execute.sandbox.pool import EnginePool
from pytest_hemra.resolve.plan import RecordedRun, missing_variables
from pytest_hemra.resolve.spec import RunSpec, SandboxSettings
from pytest_hemra.resolve.upstreams import configured_upstreams
from pytest_hemra.run.lease import LEASE_SECS, Heartbeat
from pytest_hemra.run.trial import run_trial
from pytest_hemra.store import Store
from pytest_hemra.store.owner import owner_name


def sandbox_for(
    spec: RunSpec, store: Store | None, found: dict[str, ProviderFactory] | None = None
) -> SandboxProvider:
    """The run's sandbox provider, from the plug-in registry (or `found`, when already read):
    a pool of its `[[sandbox.engines]]` when it names some."""
    return _provider_for(spec.sandbox, store, found)


def run_provider(store: Store, run_id: str) -> SandboxProvider:
    """The sandbox provider a recorded run names (`hemra cancel`, `hemra serve`, the viewer's
    cancel): read from its `[sandbox]` table alone, so any recorded run can be cancelled."""
    settings = store.run(run_id).plan.settings.get("sandbox") or {}
    return _provider_for(SandboxSettings.model_validate(settings), store, None)


def _provider_for(
    settings: SandboxSettings, store: Store | None, found: dict[str, ProviderFactory] | None
) -> SandboxProvider:
    if settings.engines:
        return EnginePool(settings.engines, store, owner_name())
    factories = registry.sandbox_providers() if found is None else found
    if settings.provider not in factories:
        known = ", ".join(sorted(factories))
        raise HemraError(f"sandbox provider '{settings.provider}' is not installed ({known})")
    provider: SandboxProvider = factories[settings.provider]()
    return provider


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

    def started_gateway(self) -> Gateway:
        """This process's gateway, started on first use: loopback plus where sandboxes reach."""
        if self.gateway is None:
            host = self.provider.gateway_host()
            hosts = ["127.0.0.1", *([host] if host and host != "127.0.0.1" else [])]
            if isinstance(self.provider, EnginePool):  # every engine's sandboxes reach it
                hosts = list(dict.fromkeys([*hosts, *self.provider.gateway_hosts()]))
            writer = Store(self.store.path)  # its own connection, for the gateway's writer thread
            upstreams = configured_upstreams(self.run.spec.providers)
            self.gateway = Gateway(upstreams, writer.record_call, hosts).start()
            self.gateway_host = host or "127.0.0.1"
            if self.run.spec.budget_usd is not None:
                reader, run_id = Store(self.store.path), self.run.id
                self.budget = RunBudget(self.run.spec.budget_usd, lambda: reader.run_cost(run_id))
        return self.gateway

    def _budgets(self, trial: TrialRecord) -> Budgets | None:
        """The budgets a trial's calls must fit in: the run's `budget_usd` and its cell's
        `cell_budget_usd` (a harness, or a harness x model pair), each read from the store."""
        budgets = [self.budget] if self.budget is not None else []
        limit = self.run.spec.cell_budget_usd
        if limit is not None:
            if trial.cell not in self.cell_budgets:
                reader, run_id = Store(self.store.path), self.run.id
                harness, model = trial.harness, trial.model
                self.cell_budgets[trial.cell] = RunBudget(
                    limit, lambda: reader.cell_cost(run_id, harness, model), "cell budget"
                )
            budgets.append(self.cell_budgets[trial.cell])
        return Budgets(budgets) if budgets else None

    def work(self, trial: TrialRecord) -> str | None:
        """Claim the trial's job and, once leased, run the trial to a recorded result (read it
        with `store.trial`). A finished trial is left alone; a job another runner holds, or
        has replaced or deselected, is not run: the returned text says so."""
        if trial.is_finished:
            return None
        missing = missing_variables(self.run.harnesses[trial.harness], self.run.spec)
        if missing:  # not claimed: the job stays queued for a runner that has the variable
            return (
                f"hemra: {trial.id} left queued: harness {trial.harness!r} needs environment "
                f"variable {missing[0]}, which this runner's environment lacks"
            )
        state = self.store.claim(trial.id, self.worker, LEASE_SECS)
        if state == "leased":
            self._run(trial)
        elif state in ("taken", "cancelling"):
            return f"hemra: {trial.id} is running in another runner"
        elif state in ("replaced", "deselected"):
            return f"hemra: {trial.id} was {state} by another runner"
        return None

    def _run(self, trial: TrialRecord) -> None:
        run, store = self.run, self.store
        trial_dir = run.trials_dir / trial.dataset / trial.task / folder_name(trial)
        try:
            task = run.task(trial)
        except HemraError as error:  # its files changed since the run was recorded (a link out)
            now = time.time()
            failed = TrialResult(
                outcome=Outcome.INFRA_ERROR, reward=None, rewards={}, exit_code=None,
                error=str(error), started_at=now, finished_at=now, duration=0.0, phases={},
                trial_dir=str(trial_dir),
            )  # fmt: skip
            store.finish_trial(trial.id, asdict(failed))
            return
        context = TrialContext(
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
            pool=self.provider if isinstance(self.provider, EnginePool) else None,
        )

        def stop_sandbox() -> None:
            self.provider.remove_sandboxes({"hemra.trial": trial.id})

        with Heartbeat(store.path, trial.id, self.worker, stop_sandbox) as beat:
            try:
                result = self._run_kind(context, trial)
            except KeyboardInterrupt:
                store.cancel_trials([trial.id], "interrupted (Ctrl-C)")
                raise
        if beat.cancelled.is_set() or store.job_state(trial.id) == "cancelling":
            result = replace(
                result, outcome=Outcome.CANCELLED, reward=None, error="cancelled by hemra cancel"
            )
        elif result.is_scored:
            result = self._with_upstream_refusals(trial, result)
        store.finish_trial(trial.id, asdict(result))

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

    def next_attempt(self, record: TrialRecord) -> TrialRecord | None:
        """After an infrastructure error with retries left, the row that runs the trial again
        (a new attempt); otherwise None."""
        if (
            record.outcome == Outcome.INFRA_ERROR
            and record.retries < self.run.spec.max_infra_retries
        ):
            return self.store.replace_trial(record.id, retry=True)
        return None

    def close(self) -> None:
        if self.gateway is not None:
            url = self.gateway.base_urls.get(self.gateway_host)
            proxy = self.gateway.egress.urls.get(self.gateway_host)
            self.gateway.stop()
            self.gateway = None
            if isinstance(self.provider, DockerProvider):  # its port closed, its run's network
                with contextlib.suppress(HemraError):  # gone already: reaped by the next runner
                    self.provider.release(
                        self.run.id,
                        urlsplit(url).port if url else None,
                        urlsplit(proxy).port if proxy else None,
                    )


def folder_name(trial: TrialRecord) -> str:
    """`harness-attempt` (`harness@model-attempt` in a matrix run, the model's `/` and other
    characters a path cannot hold as `_`); a row that ran a trial again (a retry, a resume)
    adds its seq."""
    name = re.sub(r"[^A-Za-z0-9._@-]", "_", f"{trial.cell}-{trial.attempt}")
    return f"{name}.{trial.seq}" if trial.replaces else name
