"""The controller: the pytest plug-in where a run is resolved, recorded and reported.

Registered in the process pytest was started in (never in an xdist worker). `open_controller`
resolves and records the plan once, at configure time (or, with `--hemra-resume`, takes up a
recorded run; with `--collect-only`, only resolves). The controller hands the run id and the
store to each xdist worker (`pytest_configure_node`); without pytest-xdist it registers a worker
on its own runner, since this process then runs the trials too. At the session's end it reports
the run, trips its gates and writes the summary.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_hemra.core.errors import HemraError, InputWarning
from pytest_hemra.core.ids import unknown_run
from pytest_hemra.core.lifecycle import RunStatus, TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.core.store_location import redacted, store_location
from pytest_hemra.core.terminal import terminal_width
from pytest_hemra.core.text import printable, printable_lines
from pytest_hemra.core.words import plural
from pytest_hemra.execute.provisioning import ProviderFactory, provision
from pytest_hemra.plugin import WORKER
from pytest_hemra.plugin.items import TrialWork
from pytest_hemra.plugin.protocol import rerun_status
from pytest_hemra.plugin.reporter import OUTPUT
from pytest_hemra.plugin.worker import Worker, providers
from pytest_hemra.report.gates import Gate, parse_gate, tripped
from pytest_hemra.resolve.plan import Plan, load_recorded, record_plan
from pytest_hemra.run.job import Runner, sandbox_for
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive, owner_name

if TYPE_CHECKING:  # the report's stack (numpy, jinja2) loads when the report is made, not
    # before the first trial: there its import hides behind the run's network being released
    from pytest_hemra.report.comparison import RunComparison
    from pytest_hemra.report.tables import RunReport


def open_controller(config: pytest.Config, plan: Plan | None) -> Controller:
    """The controller of this session's run: `plan` (`resolve_session_plan`'s) recorded, or a
    recorded run taken up (`--hemra-resume`, no plan) or, under `--collect-only`, the plan
    alone. Its runner is closed with the session's config."""
    gates = tuple(parse_gate(text) for text in config.getoption("hemra_fail_on"))
    found = providers(config)
    if plan is None:
        runner = _resume(config, found)
        config.add_cleanup(runner.close)
        return Controller(runner, (), runner.run.dataset_paths, gates)
    collect_only = bool(config.getoption("collectonly"))
    for warning in plan.warnings:
        config.issue_config_time_warning(InputWarning(warning), stacklevel=2)
    provision(plan, found, check_sandbox=not collect_only, note=_terminal_line(config))
    paths = {dataset.name: dataset.path for dataset in plan.datasets}
    if collect_only:
        return Controller(None, plan.trials, paths, gates)
    store = Store(store_location(config.getoption("hemra_store"), "--hemra-store").address)
    config.add_cleanup(store.close)  # last: after the runner's close (cleanups run in reverse)
    _check_run_named(config, store, "hemra_compare")
    provider = sandbox_for(plan.spec, store, found)
    run = load_recorded(store, record_plan(plan, store))
    runner = Runner(store, run, provider, owner_name())
    config.add_cleanup(runner.close)
    return Controller(runner, (), paths, gates)


def _terminal_line(config: pytest.Config) -> Callable[[str], None]:
    """A line for the terminal at resolve (task images being built), when there is one."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return (lambda line: None) if reporter is None else reporter.write_line


def _resume(config: pytest.Config, found: dict[str, ProviderFactory]) -> Runner:
    """Finish a recorded run: trials whose runner is gone, that hit an infrastructure error,
    that an interrupt cancelled (an `interrupted` run's), or that were cancelled on purpose
    (if asked) run again under new rows; finished ones are reported."""
    location = store_location(config.getoption("hemra_store"), "--hemra-store")
    if not location.exists():
        raise HemraError(f"--hemra-resume: no store at {location.describe()}")
    store = Store(location.address)
    config.add_cleanup(store.close)
    _check_run_named(config, store, "hemra_resume")
    _check_run_named(config, store, "hemra_compare")
    run_id = config.getoption("hemra_resume")
    run = load_recorded(store, run_id)
    provider = sandbox_for(run.spec, store, found)
    for stale in store.stale_trials(run_id, is_alive):
        if store.take_over(stale, is_alive) is not None:  # unless another worker just did
            provider.remove_sandboxes({"hemra.trial": stale})
    again = {t.id for t in run.trials if t.outcome == Outcome.INFRA_ERROR}
    # a `hemra cancel`led run's cancelled trials stay so unless asked; an interrupted run's
    # were cancelled by the interrupt alone
    reopen = config.getoption("hemra_resume_cancelled") or (
        store.run(run_id).status == RunStatus.INTERRUPTED
    )
    if reopen:
        again |= {t.id for t in run.trials if t.outcome == Outcome.CANCELLED}
    for trial in sorted(again):
        provider.remove_sandboxes({"hemra.trial": trial})
        store.replace_trial(trial, retry=False)  # once: another worker's resume gets its row
    if reopen:  # after its trials are queued again: with none left, it is finished
        store.reopen_run(run_id)
    return Runner(store, load_recorded(store, run_id), provider, owner_name())


def resume_line(config: pytest.Config, store: Store, run_id: str) -> str:
    """What an interrupted session says: how many trials have a result, and the command that
    finishes the run, in the form the session was started in (`hemra run`, or pytest)."""
    trials = [t for t in store.trials(run_id) if t.status != TrialStatus.DESELECTED]
    done = sum(1 for t in trials if t.status == TrialStatus.FINISHED)
    said = f"hemra: interrupted: {done} of {plural(len(trials), 'trial')} have a result"
    if done == len(trials):
        return f"{said}; run {run_id} is finished"
    if config.pluginmanager.has_plugin(OUTPUT):  # `hemra run`
        words, prefix = ["hemra", "run", "--resume", run_id], "--"
    else:
        words, prefix = ["pytest", "--hemra-resume", run_id], "--hemra-"
    if store.run(run_id).status == RunStatus.CANCELLED:  # `hemra cancel` too: asked to resume
        words.append(f"{prefix}resume-cancelled")
    named = config.getoption("hemra_store")  # else the default store, or HEMRA_STORE's
    if named:
        words += [f"{prefix}store", redacted(named)]
    return f"{said}; finish the run with: {shlex.join(words)}"


def _check_run_named(config: pytest.Config, store: Store, option: str) -> None:
    """A run id an option names is in the store, else refused before anything runs, saying
    where HEMRA looked and which runs are there."""
    run_id = config.getoption(option)
    known = [run.id for run in store.runs()] if run_id else []
    if run_id and run_id not in known:
        where = store_location(config.getoption("hemra_store"), "--hemra-store").describe()
        flag = "--" + option.replace("_", "-")
        raise HemraError(f"{flag}: {unknown_run(run_id, where, known)}")


class Controller:
    """The run as this session knows it: `runner` is None when nothing is recorded
    (`--collect-only`, whose `planned` trials are collected all the same); the report, the
    comparison and the tripped gates once the session has finished."""

    def __init__(
        self,
        runner: Runner | None,
        planned: Sequence[PlannedTrial],
        dataset_paths: dict[str, Path],
        gates: tuple[Gate, ...],
    ) -> None:
        self.runner = runner
        self.planned = tuple(planned)
        self.dataset_paths = dataset_paths
        self.gates = gates
        self.gate_reasons: list[str] = []
        self.report: RunReport | None = None
        self.comparison: RunComparison | None = None
        self.interrupted_line: str | None = None  # how to go on, once Ctrl-C stopped the session

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if self.runner is not None:
            node.workerinput["hemra_run_id"] = self.runner.run.id
            node.workerinput["hemra_store"] = self.runner.store.address

    def pytest_report_header(self) -> list[str] | None:
        if self.runner is None:
            return None
        run = self.runner.run
        trials = plural(len(run.trials), "trial")
        return [f"hemra: run {run.id}, {trials}, store {self.runner.store.name}"]

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Without pytest-xdist this process runs the trials too: a worker on this runner.
        Known only now: xdist registers its `dsession` in a `pytest_configure` that may run
        after the one that registered this controller."""
        manager = session.config.pluginmanager
        if manager.has_plugin("dsession"):
            return
        work = None if self.runner is None else TrialWork(self.runner)
        worker = Worker(work, self.planned, self.dataset_paths, reports_in_finish_order=True)
        manager.register(worker, WORKER)

    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        return rerun_status(report)  # an xdist controller logs its workers' reports

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        runner = self.runner
        if runner is None:
            return
        store, run_id = runner.store, runner.run.id
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        if interrupted:
            # Ctrl-C: what did not finish is cancelled (never failed), its sandboxes removed,
            # the run `interrupted` for a resume to finish; no gate is tripped by it
            store.interrupt_run(run_id)
            with contextlib.suppress(HemraError):  # its engine down: removed when one is back
                runner.provider.remove_sandboxes({"hemra.run": run_id})
            self.interrupted_line = resume_line(session.config, store, run_id)
        elif not session.config.pluginmanager.has_plugin("dsession"):  # its trials are over
            runner.close_soon()  # (an xdist controller's runner runs none, and has little)
        from pytest_hemra.report.comparison import compare_runs, comparison_dict
        from pytest_hemra.report.snapshot import report_of
        from pytest_hemra.report.tables import report_dict

        self.report = report_of(store, run_id)
        previous = session.config.getoption("hemra_compare")
        self.comparison = compare_runs(store, previous, run_id) if previous else None
        if self.gates and not interrupted:
            trials = store.trials(run_id)
            self.gate_reasons = tripped(self.gates, trials, self.report, self.comparison)
            if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
                failed = bool(self.gate_reasons)
                session.exitstatus = pytest.ExitCode.TESTS_FAILED if failed else pytest.ExitCode.OK
        summary_path = session.config.getoption("hemra_summary")
        if summary_path:
            data = report_dict(self.report)
            data["exit_status"] = int(session.exitstatus)
            data["gates"] = {"tripped": self.gate_reasons}
            if self.comparison is not None:
                data["comparison"] = comparison_dict(self.comparison)
            Path(summary_path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """After an interrupt, the last line said: how to finish the run (after pytest's own
        lines, `!!! KeyboardInterrupt !!!` under plain pytest)."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if self.interrupted_line is not None and reporter is not None:
            reporter.write_line(self.interrupted_line, yellow=True)

    def pytest_terminal_summary(
        self, terminalreporter: pytest.TerminalReporter, config: pytest.Config
    ) -> None:
        if self.runner is None:
            return
        from pytest_hemra.report.comparison import render_comparison
        from pytest_hemra.report.formats import render_text
        from pytest_hemra.report.snapshot import report_of

        terminalreporter.write_sep("=", "HEMRA")
        report = self.report or report_of(self.runner.store, self.runner.run.id)
        # a terminal: its width, the most important columns kept (a log file or CI: every
        # column, unless COLUMNS says otherwise; --hemra-wide: every column)
        width = (
            None
            if config.getoption("hemra_wide")
            else config.get_terminal_writer().fullwidth
            if terminalreporter.isatty()
            else terminal_width()
        )
        # what an agent chose (a model's name, an error's words) shown, never obeyed by the terminal
        terminalreporter.write_line(printable_lines(render_text(report, width=width)))
        if self.comparison is not None:
            terminalreporter.write_line(
                "\n" + printable_lines(render_comparison(self.comparison, width=width))
            )
        for reason in self.gate_reasons:
            terminalreporter.write_line(
                f"hemra: fail-on gate tripped: {printable(reason)}", red=True
            )
