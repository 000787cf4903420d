"""The pytest face of HEMRA: resolve and record, collection, the item, reports.

Registered by `pytest_hemra.options` (the `pytest11` entry point, which also holds the options)
only when a run is asked for. The controller resolves and records the plan once; xdist workers
get the run id through `workerinput` and collect the same items, in the same order, from the
store. Working a trial's job (claim, heartbeat, run, retry, cancel) is `run.job.Runner`'s.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_hemra.core import registry
from pytest_hemra.core.errors import HemraError, InputWarning, StoreUnavailable
from pytest_hemra.core.ids import unknown_run
from pytest_hemra.core.lifecycle import TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import PlannedTrial, TrialRecord
from pytest_hemra.core.reward import shown_reward
from pytest_hemra.core.store_location import store_location
from pytest_hemra.core.text import printable, printable_lines
from pytest_hemra.core.usage import Usage
from pytest_hemra.core.words import plural
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.provisioning import ProviderFactory, provision
from pytest_hemra.report.comparison import (
    RunComparison,
    compare_runs,
    comparison_dict,
    render_comparison,
)
from pytest_hemra.report.formats import render_text
from pytest_hemra.report.gates import Gate, parse_gate, tripped
from pytest_hemra.report.tables import RunReport, build_report, report_dict
from pytest_hemra.resolve.overrides import Overrides, read_overrides
from pytest_hemra.resolve.plan import load_recorded, record_plan, resolve_plan
from pytest_hemra.run.job import Runner, sandbox_for
from pytest_hemra.run.lanes import Lanes, settle
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive, owner_name


@dataclass
class HemraSession:
    """What one pytest process knows of the run it is part of; `runner` is None when nothing
    is recorded (`--collect-only`)."""

    runner: Runner | None
    planned: tuple[PlannedTrial, ...]
    dataset_paths: dict[str, Path]
    gates: tuple[Gate, ...] = ()
    gate_reasons: list[str] = field(default_factory=list)
    report: RunReport | None = None
    comparison: RunComparison | None = None
    lanes: Lanes | None = None  # several trials at once in this process (`run/lanes.py`)


SESSION = pytest.StashKey[HemraSession]()


def overrides_from(config: pytest.Config) -> Overrides:
    return read_overrides(lambda flag: config.getoption(flag.dest))


def providers(config: pytest.Config) -> dict[str, ProviderFactory]:
    """Every sandbox provider: pytest's plugin manager is the registry (conftest plug-ins too)."""
    registry.use(config.pluginmanager)
    return registry.sandbox_providers()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
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
        store = Store(config.workerinput["hemra_store"])
        run = load_recorded(store, config.workerinput["hemra_run_id"])
        runner = Runner(store, run, sandbox_for(run.spec, store, found), owner_name())
        return HemraSession(runner, (), run.dataset_paths)
    if config.getoption("hemra_resume"):
        return _resume_session(config, found)
    run_option = config.getoption("hemra_run")
    run_file = Path(run_option) if run_option else None
    collect_only = bool(config.getoption("collectonly"))
    plan = resolve_plan(run_file, overrides_from(config), Path.cwd())
    for warning in plan.warnings:
        config.issue_config_time_warning(InputWarning(warning), stacklevel=2)
    provision(plan, found, check_sandbox=not collect_only, note=_terminal_line(config))
    paths = {dataset.name: dataset.path for dataset in plan.datasets}
    if collect_only:
        return HemraSession(None, plan.trials, paths)
    store = Store(store_location(config.getoption("hemra_store"), "--hemra-store").address)
    _check_run_named(config, store, "hemra_compare")
    provider = sandbox_for(plan.spec, store, found)
    run = load_recorded(store, record_plan(plan, store))
    return HemraSession(Runner(store, run, provider, owner_name()), plan.trials, paths)


def _terminal_line(config: pytest.Config) -> Callable[[str], None]:
    """A line for the terminal at resolve (task images being built), when there is one."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return (lambda line: None) if reporter is None else reporter.write_line


def _resume_session(config: pytest.Config, found: dict[str, ProviderFactory]) -> HemraSession:
    """Finish a recorded run: trials whose runner is gone, that hit an infrastructure error
    (or were cancelled, if asked) run again under new rows; finished ones are reported."""
    location = store_location(config.getoption("hemra_store"), "--hemra-store")
    if not location.exists():
        raise HemraError(f"--hemra-resume: no store at {location.describe()}")
    store = Store(location.address)
    _check_run_named(config, store, "hemra_resume")
    _check_run_named(config, store, "hemra_compare")
    run_id = config.getoption("hemra_resume")
    run = load_recorded(store, run_id)
    provider = sandbox_for(run.spec, store, found)
    for stale in store.stale_trials(run_id, is_alive):
        if store.take_over(stale, is_alive) is not None:  # unless another worker just did
            provider.remove_sandboxes({"hemra.trial": stale})
    again = {t.id for t in run.trials if t.outcome == Outcome.INFRA_ERROR}
    if config.getoption("hemra_resume_cancelled"):
        again |= {t.id for t in run.trials if t.outcome == Outcome.CANCELLED}
        store.reopen_run(run_id)
    for trial in sorted(again):
        provider.remove_sandboxes({"hemra.trial": trial})
        store.replace_trial(trial, retry=False)  # once: another worker's resume gets its row
    run = load_recorded(store, run_id)
    return HemraSession(Runner(store, run, provider, owner_name()), (), run.dataset_paths)


def _check_run_named(config: pytest.Config, store: Store, option: str) -> None:
    """A run id an option names is in the store, else refused before anything runs, saying
    where HEMRA looked and which runs are there."""
    run_id = config.getoption(option)
    known = [run.id for run in store.runs()] if run_id else []
    if run_id and run_id not in known:
        where = store_location(config.getoption("hemra_store"), "--hemra-store").describe()
        flag = "--" + option.replace("_", "-")
        raise HemraError(f"{flag}: {unknown_run(run_id, where, known)}")


def _runner(config: pytest.Config) -> Runner | None:
    """This process's runner, when it works a recorded run."""
    hemra = config.stash.get(SESSION, None)
    return None if hemra is None else hemra.runner


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    runner = _runner(node.config)
    if runner is not None:
        node.workerinput["hemra_run_id"] = runner.run.id
        node.workerinput["hemra_store"] = runner.store.address


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    runner = _runner(config)
    if runner is None:
        return None
    run = runner.run
    return [f"hemra: run {run.id}, {plural(len(run.trials), 'trial')}, store {runner.store.name}"]


def pytest_collection(session: pytest.Session) -> bool | None:
    hemra = session.config.stash.get(SESSION, None)
    if hemra is None or session.config.pluginmanager.has_plugin("dsession"):
        return None
    hook = session.config.hook
    hook.pytest_collectstart(collector=session)
    planned: list[PlannedTrial | TrialRecord] = (
        list(hemra.runner.run.trials) if hemra.runner is not None else list(hemra.planned)
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
    runner = _runner(trials[0].config) if trials else None
    if runner is not None:
        # every xdist worker deselects the same items: the update is idempotent
        runner.store.deselect_trials(runner.run.id, [t.nodeid for t in trials])


def _lane_count(config: pytest.Config, runner: Runner) -> int:
    """This process's share of the run's concurrency (`--hemra-concurrency`, else the run's
    `concurrency`): all of it, or under pytest-xdist its part among the workers."""
    wanted = config.getoption("hemra_concurrency") or runner.run.spec.concurrency
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    return max(1, math.ceil(wanted / workers))


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """With more than one lane, start this process's lanes on its trials; without
    pytest-xdist, report the items as their trials finish (an xdist worker's own loop runs
    its items, each waiting for its trial)."""
    config = session.config
    hemra = config.stash.get(SESSION, None)
    if hemra is None or hemra.runner is None or config.option.collectonly:
        return None
    if config.pluginmanager.has_plugin("dsession") or session.testsfailed:
        return None  # the xdist controller; or collection errors (pytest's own loop says so)
    size = _lane_count(config, hemra.runner)
    items = {
        i.trial.id: i
        for i in session.items
        if isinstance(i, TrialItem) and isinstance(i.trial, TrialRecord)
    }
    if size < 2 or not items:
        return None
    trials = [i.trial for i in items.values() if isinstance(i.trial, TrialRecord)]
    hemra.lanes = Lanes(hemra.runner, size).start(trials)
    if hasattr(config, "workerinput"):
        return None
    left = dict.fromkeys(session.items)
    not_trials = [i for i in session.items if i not in items.values()]
    finished = (items[t.id] for t in hemra.lanes.in_finish_order(trials))  # as each finishes
    for item in itertools.chain(not_trials, finished):
        del left[item]
        # which item runs next is known only when its trial finishes: an item of another
        # dataset, if any is left, tears this one's dataset down (pytest's setup state holds
        # one dataset at a time, and a trial of any dataset may finish next)
        others = (i for i in left if i.parent is not item.parent)
        nextitem = next(others, next(iter(left), None))
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
    return True


class DatasetCollector(pytest.Collector):
    def __init__(self, *, trials: list[PlannedTrial | TrialRecord], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trials = trials

    def collect(self) -> list[pytest.Item]:
        return [
            TrialItem.from_parent(
                self, name=f"{t.task}[{t.cell}-{t.attempt}]", path=self.path / t.task, trial=t
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
        models = {trial.model, trial.cell} if trial.model is not None else set()
        self.extra_keyword_matches.update({trial.task, trial.harness, trial.dataset, *models})

    def setup(self) -> None:
        runner = _runner(self.config)
        trial = self.trial
        if runner is None or not isinstance(trial, TrialRecord):
            pytest.fail("hemra: this session recorded no run", pytrace=False)
        self.user_properties.clear()
        self.record = None
        lanes = self.config.stash[SESSION].lanes
        try:
            # its result: run here, or by another runner, or by the row that took it over
            # from a runner that is gone (`run/lanes.settle`); without lanes, not waited for
            settled = (
                settle(runner, trial, runner.work, wait=False)
                if lanes is None
                else lanes.work(trial)
            )
        except StoreUnavailable as error:  # waited out in vain: this session runs no more
            pytest.fail(f"hemra: {error}", pytrace=False)
        if isinstance(settled, str):
            pytest.skip(settled)
        self.trial = self.record = settled  # a row that took the trial over: its own
        self._report(settled)

    def _report(self, record: TrialRecord) -> None:
        own = record.own_report
        self.user_properties.extend(
            [
                ("outcome", str(record.outcome or record.status)),  # plain text for xdist
                ("reward", "" if record.reward is None else f"{record.reward:g}"),
                ("duration", "" if record.duration is None else f"{record.duration:.3f}"),
                ("tokens", str(record.tokens)),
                ("cost", "unknown" if record.cost is None else f"{record.cost:.6f}"),
                ("retries", str(record.retries)),
                ("stopped_by", record.stopped_by or ""),
                ("own_tokens", "" if own is None else str(Usage.of(own).total_tokens)),
                ("trial", record.id),
                ("trial_dir", record.trial_dir or ""),
                ("engine", record.engine or ""),
            ]
        )
        if record.outcome == Outcome.CANCELLED:
            pytest.skip(f"cancelled: {printable(record.error or '')}".rstrip(": "))
        if record.outcome in Outcome.ERROR:
            pytest.fail(self._verdict(record), pytrace=False)

    def runtest(self) -> None:
        record = self.record
        if record is not None and record.outcome in Outcome.FAILED:
            pytest.fail(self._verdict(record), pytrace=False)

    def next_attempt(self) -> TrialRecord | None:
        """After an infrastructure error with retries left, the new attempt's row."""
        runner = _runner(self.config)
        if runner is None or self.record is None:
            return None
        return runner.next_attempt(self.record)

    def _verdict(self, record: TrialRecord) -> str:
        reward = shown_reward(record.outcome, record.reward)
        detail = f": {printable(record.error)}" if record.error else ""
        exit_code = "" if record.exit_code in (0, None) else f", exit code {record.exit_code}"
        return f"{record.outcome} ({reward}{exit_code}){detail} - see {record.trial_dir}"

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name


def _run_phases(item: pytest.Item, nextitem: pytest.Item | None) -> list[pytest.TestReport]:
    """An item's setup, call and teardown reports, not yet logged.

    pytest has no public way to run an item's phases and hold back their reports, which a
    retry needs (the first attempt's setup is reported as `rerun`), so this one call uses
    the private `_pytest.runner`, as pytest-rerunfailures does."""
    from _pytest.runner import runtestprotocol

    return runtestprotocol(item, nextitem=nextitem, log=False)


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
        reports = _run_phases(item, nextitem)
        retry = item.next_attempt()
        if retry is not None:
            for report in reports:
                if report.when == "setup":
                    report.outcome = "rerun"  # type: ignore[assignment]
                    hook.pytest_runtest_logreport(report=report)
            item.trial = retry
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
    if hemra is not None and hemra.lanes is not None:  # trials still running: recorded
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            hemra.lanes.stop("interrupted (Ctrl-C)")
        elif session.shouldfail or session.shouldstop:
            hemra.lanes.stop("the session stopped before its end (-x, --maxfail)")
        else:  # its items done (an xdist worker's: its lanes may run a sibling's trials)
            hemra.lanes.stop("the session ended", running=False)
    if hemra is None or hemra.runner is None or hasattr(session.config, "workerinput"):
        return
    runner = hemra.runner
    store, run_id = runner.store, runner.run.id
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        # Ctrl-C: what did not finish is cancelled (never failed), its sandboxes removed
        left = [t.id for t in store.trials(run_id) if t.status in TrialStatus.UNFINISHED]
        store.cancel_trials(left, "interrupted (Ctrl-C)")
        with contextlib.suppress(HemraError):  # its engine down: removed when a runner is back
            runner.provider.remove_sandboxes({"hemra.run": run_id})
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
    runner = _runner(config)
    if runner is not None:
        runner.close()


@pytest.fixture(scope="session")
def hemra_gateway(request: pytest.FixtureRequest) -> Gateway:
    """The gateway of this pytest process (one per runner process, also per xdist worker)."""
    runner = _runner(request.config)
    if runner is None:
        pytest.fail("hemra_gateway needs a HEMRA session (--hemra-run or --hemra-harness)")
    return runner.started_gateway()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    hemra = config.stash.get(SESSION, None)
    if hemra is None or hemra.runner is None or hasattr(config, "workerinput"):
        return
    terminalreporter.write_sep("=", "HEMRA")
    report = hemra.report or build_report(hemra.runner.store, hemra.runner.run.id)
    # a terminal: its width, the most important columns kept (a log file or CI: every column)
    width = terminalreporter._tw.fullwidth if terminalreporter.isatty() else None
    # what an agent chose (a model's name, an error's words) shown, never obeyed by the terminal
    terminalreporter.write_line(printable_lines(render_text(report, width=width)))
    if hemra.comparison is not None:
        terminalreporter.write_line("\n" + printable_lines(render_comparison(hemra.comparison)))
    for reason in hemra.gate_reasons:
        terminalreporter.write_line(f"hemra: fail-on gate tripped: {printable(reason)}", red=True)
