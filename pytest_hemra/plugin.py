"""The pytest face of HEMRA: options, resolve and record, collection, items, reports.

The controller resolves and records the plan once; xdist workers get the run id through
`workerinput` and collect the same items, in the same order, from the store.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from _pytest.runner import runtestprotocol

from pytest_hemra.core import hookspecs
from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.records import PlannedTrial, TrialRecord
from pytest_hemra.execute.gateway.ledger import RunBudget
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.kinds.harbor.trials import run_harbor_trial
from pytest_hemra.execute.sandbox import SandboxProvider
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.execute.sandbox.pool import EnginePool
from pytest_hemra.report.comparison import (
    RunComparison,
    compare_runs,
    comparison_dict,
    render_comparison,
)
from pytest_hemra.report.formats import render_text
from pytest_hemra.report.gates import Gate, parse_gate, tripped
from pytest_hemra.report.tables import RunReport, build_report, report_dict
from pytest_hemra.resolve.plan import (
    ProviderFactory,
    RecordedRun,
    load_recorded,
    record_plan,
    resolve_plan,
)
from pytest_hemra.resolve.spec import Overrides, RunSpec
from pytest_hemra.resolve.upstreams import configured_upstreams
from pytest_hemra.run.lease import LEASE_SECS, Heartbeat, is_alive, owner_name
from pytest_hemra.run.trial import TrialContext, run_trial
from pytest_hemra.store import Store

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
    gates: tuple[Gate, ...] = ()
    gate_reasons: list[str] = field(default_factory=list)
    report: RunReport | None = None
    comparison: RunComparison | None = None

    def started_gateway(self) -> Gateway:
        """This process's gateway, started on first use: loopback plus where sandboxes reach."""
        if self.gateway is None:
            if self.run is None or self.store is None:
                raise HemraError("hemra: this session recorded no run")
            host = self.provider.gateway_host()
            hosts = ["127.0.0.1", *([host] if host and host != "127.0.0.1" else [])]
            if isinstance(self.provider, EnginePool):  # every engine's sandboxes reach it
                hosts = list(dict.fromkeys([*hosts, *self.provider.gateway_hosts()]))
            writer = Store(self.store.path)  # its own connection, for the gateway's writer thread
            providers = configured_upstreams(self.run.spec.providers)
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
        "--hemra-resume",
        metavar="RUN_ID",
        help="finish a recorded run: report finished trials from the store, run the rest",
    )
    group.addoption(
        "--hemra-resume-cancelled",
        action="store_true",
        help="with --hemra-resume, also run the trials that were cancelled",
    )
    group.addoption(
        "--hemra-fail-on",
        action="append",
        default=[],
        metavar="GATE",
        help="exit 1 when the run trips a gate: unfinished, failure, regression, score<X,"
        " HARNESS:score<X",
    )
    group.addoption(
        "--hemra-summary",
        metavar="PATH",
        help="write the run's tables, flags and gates as JSON here, for CI",
    )
    group.addoption(
        "--hemra-compare",
        metavar="RUN_ID",
        help="compare each harness with itself in an earlier run of the same store",
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
        or config.getoption("hemra_resume")
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
    for extra in config.hook.pytest_hemra_sandbox_providers():
        found.update(extra)
    return found


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not is_active(config):
        return
    try:
        gates = tuple(parse_gate(text) for text in config.getoption("hemra_fail_on"))
        config.stash[SESSION] = replace(_open_session(config), gates=gates)
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
            store, run, (), run.dataset_paths, _sandbox(run.spec, found, store), owner_name()
        )
    if config.getoption("hemra_resume"):
        return _resume_session(config, found)
    run_option = config.getoption("hemra_run")
    run_file = Path(run_option) if run_option else None
    collect_only = bool(config.getoption("collectonly"))
    plan = resolve_plan(
        run_file, overrides_from(config), Path.cwd(), found, check_sandbox=not collect_only
    )
    paths = {dataset.name: dataset.path for dataset in plan.datasets}
    if collect_only:
        provider = _sandbox(plan.spec, found, None)
        return HemraSession(None, None, plan.trials, paths, provider, owner_name())
    store_option = config.getoption("hemra_store")
    store = Store(Path(store_option) if store_option else plan.base_dir / DEFAULT_STORE)
    provider = _sandbox(plan.spec, found, store)
    run_id = record_plan(plan, store)
    return HemraSession(
        store, load_recorded(store, run_id), plan.trials, paths, provider, owner_name()
    )


def _sandbox(
    spec: RunSpec, found: dict[str, ProviderFactory], store: Store | None
) -> SandboxProvider:
    """The run's sandbox provider: a pool of its `[[sandbox.engines]]` when it names some."""
    if spec.sandbox.engines:
        return EnginePool(spec.sandbox.engines, store, owner_name())
    return found[spec.sandbox.provider]()


def _resume_session(config: pytest.Config, found: dict[str, ProviderFactory]) -> HemraSession:
    """Finish a recorded run: trials whose runner is gone, that hit an infrastructure error
    (or were cancelled, if asked) run again under new rows; finished ones are reported."""
    store_option = config.getoption("hemra_store")
    store_path = Path(store_option) if store_option else Path.cwd() / DEFAULT_STORE
    if not store_path.is_file():
        raise HemraError(f"{store_path}: no store here (pass --hemra-store PATH)")
    store = Store(store_path)
    run_id = config.getoption("hemra_resume")
    run = load_recorded(store, run_id)
    provider = _sandbox(run.spec, found, store)
    again = set(store.stale_trials(run_id, is_alive))
    again |= {t.id for t in run.trials if t.outcome == "infra_error"}
    if config.getoption("hemra_resume_cancelled"):
        again |= {t.id for t in run.trials if t.outcome == "cancelled"}
        store.reopen_run(run_id)
    for trial in sorted(again):
        provider.remove_sandboxes({"hemra.trial": trial})
        store.replace_trial(trial, retry=False)
    run = load_recorded(store, run_id)
    return HemraSession(store, run, (), run.dataset_paths, provider, owner_name())


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
    the verdict in the call phase (so a failing harness is a failed test).

    The verdict always comes from the trial's row in the store, written before it is reported:
    a trial finished by an earlier session (`--hemra-resume`) is reported without running."""

    def __init__(self, *, trial: PlannedTrial | TrialRecord, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trial = trial
        self.record: TrialRecord | None = None
        self.extra_keyword_matches.update({trial.task, trial.harness, trial.dataset})

    def setup(self) -> None:
        hemra = self.config.stash[SESSION]
        trial = self.trial
        if hemra.run is None or hemra.store is None or not isinstance(trial, TrialRecord):
            pytest.fail("hemra: this session recorded no run", pytrace=False)
        self.user_properties.clear()
        self.record = None
        store = hemra.store
        if not trial.is_finished:
            state = store.claim(trial.id, hemra.worker, LEASE_SECS)
            if state == "leased":
                self._run(hemra, trial)
            elif state in ("taken", "cancelling"):
                pytest.skip(f"hemra: {trial.id} is running in another runner")
            elif state in ("replaced", "deselected"):
                pytest.skip(f"hemra: {trial.id} was {state} by another runner")
        record = store.trial(trial.id)
        self.record = record
        self._report(record)

    def _run(self, hemra: HemraSession, trial: TrialRecord) -> None:
        run, store = hemra.run, hemra.store
        assert run is not None and store is not None
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
            judges=run.judges,
            trial_dir=run.trials_dir / trial.dataset / trial.task / _folder_name(trial),
            pool=hemra.provider if isinstance(hemra.provider, EnginePool) else None,
        )

        def stop_sandbox() -> None:
            hemra.provider.remove_sandboxes({"hemra.trial": trial.id})

        with Heartbeat(store.path, trial.id, hemra.worker, stop_sandbox) as beat:
            try:
                if context.harness.spec.kind == "harbor":
                    result = run_harbor_trial(context, run, store, trial)
                else:
                    result = run_trial(context)
            except KeyboardInterrupt:
                store.cancel_trials([trial.id], "interrupted (Ctrl-C)")
                raise
        if beat.cancelled.is_set() or store.job_state(trial.id) == "cancelling":
            result = replace(
                result, outcome="cancelled", reward=None, error="cancelled by hemra cancel"
            )
        store.finish_trial(trial.id, asdict(result))

    def _report(self, record: TrialRecord) -> None:
        own = record.own_report
        self.user_properties.extend(
            [
                ("outcome", record.outcome or record.status),
                ("reward", "" if record.reward is None else f"{record.reward:g}"),
                ("duration", "" if record.duration is None else f"{record.duration:.3f}"),
                ("tokens", str(record.tokens)),
                ("cost", "unknown" if record.cost is None else f"{record.cost:.6f}"),
                ("retries", str(record.retries)),
                ("stopped_by", record.stopped_by or ""),
                ("own_tokens", "" if own is None else str(_own_total(own))),
                ("trial", record.id),
                ("trial_dir", record.trial_dir or ""),
                ("engine", record.engine or ""),
            ]
        )
        if record.outcome == "cancelled":
            pytest.skip(f"cancelled: {record.error or ''}".rstrip(": "))
        if record.outcome in ERROR_OUTCOMES:
            pytest.fail(self._verdict(record), pytrace=False)

    def runtest(self) -> None:
        record = self.record
        if record is not None and record.outcome in FAILED_OUTCOMES:
            pytest.fail(self._verdict(record), pytrace=False)

    def should_retry(self) -> bool:
        """An infrastructure error with retries left runs again, as a new attempt row."""
        hemra = self.config.stash[SESSION]
        record = self.record
        return (
            record is not None
            and hemra.run is not None
            and record.outcome == "infra_error"
            and record.retries < hemra.run.spec.max_infra_retries
        )

    def _verdict(self, record: TrialRecord) -> str:
        reward = "no reward" if record.reward is None else f"reward {record.reward:g}"
        detail = f": {record.error}" if record.error else ""
        exit_code = "" if record.exit_code in (0, None) else f", exit code {record.exit_code}"
        return f"{record.outcome} ({reward}{exit_code}){detail} - see {record.trial_dir}"

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name


def _folder_name(trial: TrialRecord) -> str:
    """`harness-attempt`; a row that ran a trial again (a retry, a resume) adds its seq."""
    name = f"{trial.harness}-{trial.attempt}"
    return f"{name}.{trial.seq}" if trial.replaces else name


def _own_total(own: dict[str, Any]) -> int:
    keys = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return sum(int(own.get(key) or 0) for key in keys)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run a trial, and again after an infrastructure error while retries are left: each
    retry is a new attempt row, its predecessor reported as `rerun`, and the trial is one
    test case (one JUnit testcase) whatever the retries."""
    if not isinstance(item, TrialItem):
        return None
    hook = item.ihook
    hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    while True:
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        hemra = item.config.stash[SESSION]
        if item.should_retry() and item.record is not None and hemra.store is not None:
            for report in reports:
                if report.when == "setup":
                    report.outcome = "rerun"  # type: ignore[assignment]
                    hook.pytest_runtest_logreport(report=report)
            item.trial = hemra.store.replace_trial(item.record.id, retry=True)
            continue
        for report in reports:
            hook.pytest_runtest_logreport(report=report)
        break
    hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, str] | None:
    if report.outcome == "rerun":  # type: ignore[comparison-overlap]
        return "rerun", "R", "RERUN"
    return None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    hemra = session.config.stash.get(SESSION, None)
    if hemra is None or hemra.run is None or hemra.store is None:
        return
    if hasattr(session.config, "workerinput"):
        return
    store, run_id = hemra.store, hemra.run.id
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        # Ctrl-C: what did not finish is cancelled (never failed), its sandboxes removed
        left = [t.id for t in store.trials(run_id) if t.status in ("planned", "running")]
        store.cancel_trials(left, "interrupted (Ctrl-C)")
        hemra.provider.remove_sandboxes({"hemra.run": run_id})
    hemra.report = build_report(store, run_id)
    previous = session.config.getoption("hemra_compare")
    hemra.comparison = compare_runs(store, previous, run_id) if previous else None
    if hemra.gates:
        trials = store.trials(run_id)
        hemra.gate_reasons = tripped(hemra.gates, trials, hemra.report, hemra.comparison)
        if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            failed = bool(hemra.gate_reasons)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED if failed else pytest.ExitCode.OK
    summary_path = session.config.getoption("hemra_summary")
    if summary_path:
        data = report_dict(hemra.report)
        data["exit_status"] = int(session.exitstatus)
        data["gates"] = {"tripped": hemra.gate_reasons}
        if hemra.comparison is not None:
            data["comparison"] = comparison_dict(hemra.comparison)
        Path(summary_path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


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
    report = hemra.report or build_report(hemra.store, hemra.run.id)
    terminalreporter.write_line(render_text(report))
    if hemra.comparison is not None:
        terminalreporter.write_line("\n" + render_comparison(hemra.comparison))
    for reason in hemra.gate_reasons:
        terminalreporter.write_line(f"hemra: fail-on gate tripped: {reason}", red=True)
