"""The pytest face of HEMRA: options, resolve and record, collection, items, reports.

The controller resolves and records the plan once; xdist workers get the run id through
`workerinput` and collect the same items, in the same order, from the store.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_hemra import hookspecs
from pytest_hemra.errors import HemraError
from pytest_hemra.gateway.ledger import RunBudget
from pytest_hemra.gateway.providers import configured_providers
from pytest_hemra.gateway.server import Gateway
from pytest_hemra.plan import ProviderFactory, RecordedRun, load_recorded, resolve_plan
from pytest_hemra.records import PlannedTrial, TrialRecord
from pytest_hemra.report import render_run
from pytest_hemra.sandbox import SandboxProvider
from pytest_hemra.sandbox.docker import DockerProvider
from pytest_hemra.spec import Overrides
from pytest_hemra.store import Store
from pytest_hemra.trial import TrialContext, TrialResult, run_trial

DEFAULT_STORE = Path(".hemra") / "hemra.db"
FAILED_OUTCOMES = frozenset({"fail", "timeout", "harness_error"})
ERROR_OUTCOMES = frozenset({"infra_error", "verifier_error"})


@dataclass
class HemraSession:
    """What one pytest process knows of the run it is part of."""

    store: Store | None
    run: RecordedRun | None
    planned: tuple[PlannedTrial, ...]
    dataset_paths: dict[str, Path]
    provider: SandboxProvider
    worker: str
    gateway: Gateway | None = None
    gateway_host: str = "127.0.0.1"
    budget: RunBudget | None = None

    def started_gateway(self) -> Gateway:
        """This process's gateway, started on first use: loopback plus where sandboxes reach."""
        if self.gateway is None:
            if self.run is None or self.store is None:
                raise HemraError("hemra: this session recorded no run")
            host = self.provider.gateway_host()
            hosts = ["127.0.0.1", *([host] if host and host != "127.0.0.1" else [])]
            writer = Store(self.store.path)  # its own connection, for the gateway's writer thread
            providers = configured_providers(self.run.spec.providers)
            self.gateway = Gateway(providers, writer.record_call, hosts).start()
            self.gateway_host = host or "127.0.0.1"
            if self.run.spec.budget_usd is not None:
                reader, run_id = Store(self.store.path), self.run.id
                self.budget = RunBudget(self.run.spec.budget_usd, lambda: reader.run_cost(run_id))
        return self.gateway


SESSION = pytest.StashKey[HemraSession]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hemra", "HEMRA: evaluate coding-agent harnesses")
    group.addoption("--hemra-run", metavar="RUN_FILE", help="run file (TOML) to evaluate")
    group.addoption(
        "--hemra-store",
        metavar="PATH",
        help="SQLite store (default: .hemra/hemra.db beside the run file)",
    )
    group.addoption(
        "--hemra-harness",
        action="append",
        default=[],
        metavar="NAME",
        help="harness to evaluate, replaces the run file's (repeatable)",
    )
    group.addoption(
        "--hemra-dataset",
        action="append",
        default=[],
        metavar="NAME",
        help="dataset name, name@digest or path, replaces the run file's",
    )
    group.addoption("--hemra-attempts", type=int, metavar="N", help="attempts per task")
    group.addoption(
        "--hemra-task",
        action="append",
        default=[],
        metavar="GLOB",
        help="select tasks by name (replaces 'tasks')",
    )
    group.addoption(
        "--hemra-exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="exclude tasks by name (replaces 'exclude')",
    )
    group.addoption("--hemra-baseline", metavar="NAME", help="harness others are compared to")
    group.addoption("--hemra-sandbox", metavar="PROVIDER", help="sandbox provider")
    group.addoption(
        "--hemra-require",
        action="append",
        default=[],
        metavar="CAPABILITY",
        help="sandbox capability the run needs (adds to 'require')",
    )
    group.addoption(
        "--hemra-verifier-env",
        action="append",
        default=[],
        metavar="NAME",
        help="environment variable passed to verifiers (adds to verifier.env)",
    )
    group.addoption(
        "--hemra-judge",
        action="append",
        default=[],
        metavar="NAME",
        help="judge to run after the verifier (adds to 'judge')",
    )


def is_active(config: pytest.Config) -> bool:
    return bool(
        config.getoption("hemra_run")
        or config.getoption("hemra_harness")
        or config.getoption("hemra_dataset")
        or (hasattr(config, "workerinput") and "hemra_run_id" in config.workerinput)
    )


def overrides_from(config: pytest.Config) -> Overrides:
    option = config.getoption
    return Overrides(
        harnesses=option("hemra_harness"),
        datasets=option("hemra_dataset"),
        attempts=option("hemra_attempts"),
        tasks=option("hemra_task"),
        exclude=option("hemra_exclude"),
        baseline=option("hemra_baseline"),
        sandbox=option("hemra_sandbox"),
        require=option("hemra_require"),
        verifier_env=option("hemra_verifier_env"),
        judges=option("hemra_judge"),
    )


def providers(config: pytest.Config) -> dict[str, ProviderFactory]:
    found: dict[str, ProviderFactory] = {"docker": DockerProvider}
    for extra in config.hook.hemra_sandbox_providers():
        found.update(extra)
    return found


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def worker_name() -> str:
    return f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}@{socket.gethostname()}:{os.getpid()}"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not is_active(config):
        return
    try:
        config.stash[SESSION] = _open_session(config)
    except HemraError as error:
        raise pytest.UsageError(str(error)) from None


def _open_session(config: pytest.Config) -> HemraSession:
    found = providers(config)
    if hasattr(config, "workerinput"):
        if "hemra_run_id" not in config.workerinput:
            raise HemraError("xdist worker got no run id from the controller")
        store = Store(Path(config.workerinput["hemra_store"]))
        run = load_recorded(store, config.workerinput["hemra_run_id"])
        return HemraSession(
            store, run, (), run.dataset_paths, found[run.spec.sandbox.provider](), worker_name()
        )
    run_option = config.getoption("hemra_run")
    run_file = Path(run_option) if run_option else None
    collect_only = bool(config.getoption("collectonly"))
    plan = resolve_plan(
        run_file, overrides_from(config), Path.cwd(), found, check_sandbox=not collect_only
    )
    provider = found[plan.spec.sandbox.provider]()
    paths = {dataset.name: dataset.path for dataset in plan.datasets}
    if collect_only:
        return HemraSession(None, None, plan.trials, paths, provider, worker_name())
    store_option = config.getoption("hemra_store")
    store = Store(Path(store_option) if store_option else plan.base_dir / DEFAULT_STORE)
    run_id = new_run_id()
    trials_dir = store.path.parent / "runs" / run_id
    store.record_plan(run_id, plan.spec.name, plan.record(), trials_dir, plan.trials)
    return HemraSession(
        store, load_recorded(store, run_id), plan.trials, paths, provider, worker_name()
    )


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    session = node.config.stash.get(SESSION, None)
    if session is not None and session.run is not None and session.store is not None:
        node.workerinput["hemra_run_id"] = session.run.id
        node.workerinput["hemra_store"] = str(session.store.path)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    session = config.stash.get(SESSION, None)
    if session is None or session.run is None or session.store is None:
        return None
    return [
        f"hemra: run {session.run.id}, {len(session.run.trials)} trials, store {session.store.path}"
    ]


def pytest_collection(session: pytest.Session) -> bool | None:
    hemra = session.config.stash.get(SESSION, None)
    if hemra is None or session.config.pluginmanager.has_plugin("dsession"):
        return None
    hook = session.config.hook
    hook.pytest_collectstart(collector=session)
    planned: list[PlannedTrial | TrialRecord] = (
        list(hemra.run.trials) if hemra.run is not None else list(hemra.planned)
    )
    items: list[pytest.Item] = []
    for dataset in dict.fromkeys(t.dataset for t in planned):
        node = DatasetCollector.from_parent(
            session,
            name=dataset,
            nodeid=dataset,
            path=hemra.dataset_paths[dataset],
            trials=[t for t in planned if t.dataset == dataset],
        )
        report = hook.pytest_make_collect_report(collector=node)
        hook.pytest_collectreport(report=report)
        items.extend(x for x in report.result if isinstance(x, pytest.Item))
    session.items = items
    hook.pytest_collection_modifyitems(session=session, config=session.config, items=items)
    hook.pytest_collection_finish(session=session)
    session.testscollected = len(items)
    return True


def pytest_deselected(items: list[pytest.Item]) -> None:
    trials = [i for i in items if isinstance(i, TrialItem)]
    if not trials:
        return
    hemra = trials[0].config.stash.get(SESSION, None)
    if hemra is not None and hemra.store is not None and hemra.run is not None:
        # every xdist worker deselects the same items: the update is idempotent
        hemra.store.deselect_trials(hemra.run.id, [t.nodeid for t in trials])


class DatasetCollector(pytest.Collector):
    def __init__(self, *, trials: list[PlannedTrial | TrialRecord], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trials = trials

    def collect(self) -> list[pytest.Item]:
        return [
            TrialItem.from_parent(
                self, name=f"{t.task}[{t.harness}-{t.attempt}]", path=self.path / t.task, trial=t
            )
            for t in self.trials
        ]


class TrialItem(pytest.Item):
    """One trial: the sandbox work happens in setup (so infrastructure faults are errors),
    the verdict in the call phase (so a failing harness is a failed test)."""

    def __init__(self, *, trial: PlannedTrial | TrialRecord, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trial = trial
        self.result: TrialResult | None = None
        self.extra_keyword_matches.update({trial.task, trial.harness, trial.dataset})

    def setup(self) -> None:
        hemra = self.config.stash[SESSION]
        trial = self.trial
        if hemra.run is None or hemra.store is None or not isinstance(trial, TrialRecord):
            pytest.fail("hemra: this session recorded no run", pytrace=False)
        if trial.is_finished:
            pytest.skip(f"already finished: {trial.outcome}")
        run = hemra.run
        hemra.store.start_trial(trial.id, hemra.worker)
        context = TrialContext(
            run_id=run.id,
            trial_id=trial.id,
            task=run.task(trial),
            harness=run.harnesses[trial.harness],
            spec=run.spec,
            provider=hemra.provider,
            gateway=hemra.started_gateway(),
            gateway_host=hemra.gateway_host,
            budget=hemra.budget,
            trial_dir=run.trials_dir
            / trial.dataset
            / trial.task
            / f"{trial.harness}-{trial.attempt}",
        )
        result = run_trial(context)
        hemra.store.finish_trial(trial.id, asdict(result))
        self.result = result
        self.user_properties.extend(
            [
                ("outcome", result.outcome),
                ("reward", "" if result.reward is None else f"{result.reward:g}"),
                ("duration", f"{result.duration:.3f}"),
                ("tokens", str(result.usage.total_tokens)),
                ("cost", "unknown" if result.usage.cost is None else f"{result.usage.cost:.6f}"),
                ("stopped_by", result.usage.stopped_by or ""),
                (
                    "own_tokens",
                    "" if result.own_report is None else str(result.own_report.total_tokens),
                ),
                ("trial", trial.id),
                ("trial_dir", result.trial_dir),
            ]
        )
        if result.outcome in ERROR_OUTCOMES:
            pytest.fail(self._verdict(result), pytrace=False)

    def runtest(self) -> None:
        result = self.result
        if result is not None and result.outcome in FAILED_OUTCOMES:
            pytest.fail(self._verdict(result), pytrace=False)

    def _verdict(self, result: TrialResult) -> str:
        reward = "no reward" if result.reward is None else f"reward {result.reward:g}"
        detail = f": {result.error}" if result.error else ""
        exit_code = "" if result.exit_code in (0, None) else f", exit code {result.exit_code}"
        return f"{result.outcome} ({reward}{exit_code}){detail} - see {result.trial_dir}"

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name


def pytest_unconfigure(config: pytest.Config) -> None:
    hemra = config.stash.get(SESSION, None)
    if hemra is not None and hemra.gateway is not None:
        hemra.gateway.stop()
        hemra.gateway = None


@pytest.fixture(scope="session")
def hemra_gateway(request: pytest.FixtureRequest) -> Gateway:
    """The gateway of this pytest process (one per runner process, also per xdist worker)."""
    hemra = request.config.stash.get(SESSION, None)
    if hemra is None:
        pytest.fail("hemra_gateway needs a HEMRA session (--hemra-run or --hemra-harness)")
    return hemra.started_gateway()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    hemra = config.stash.get(SESSION, None)
    if hemra is None or hemra.run is None or hemra.store is None:
        return
    if hasattr(config, "workerinput"):
        return
    terminalreporter.write_sep("=", "HEMRA")
    terminalreporter.write_line(render_run(hemra.store, hemra.run.id))
