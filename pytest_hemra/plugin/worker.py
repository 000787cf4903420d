"""The worker: the pytest plug-in that runs a run's trials in this process.

Registered in an xdist worker, which gets the run id and the store from the controller through
`workerinput` and resolves nothing itself (`open_worker`); and, without pytest-xdist, in the
controller's own process, on the controller's runner (`Controller.pytest_sessionstart`). Either
way it collects every trial of the recorded plan, in the plan's order, and works each item's
trial as the item runs; with more than one lane, its lanes start on the trials first.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_hemra.core import registry
from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.progress import keep_stderr
from pytest_hemra.core.records import PlannedTrial, TrialRecord
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.sandbox.providers import ProviderFactory
from pytest_hemra.plugin.items import TrialItem, TrialWork, collect_trials
from pytest_hemra.plugin.protocol import rerun_status, run_in_order, run_with_retries
from pytest_hemra.resolve.plan import load_recorded
from pytest_hemra.run.job import Runner, sandbox_for
from pytest_hemra.run.lanes import Lanes
from pytest_hemra.store import Store
from pytest_hemra.store.owner import owner_name


def providers(config: pytest.Config) -> dict[str, ProviderFactory]:
    """Every sandbox provider: pytest's plugin manager is the registry (conftest plug-ins too)."""
    registry.use(config.pluginmanager)
    return registry.sandbox_providers()


def open_worker(config: pytest.Config, workerinput: dict[str, Any]) -> Worker:
    """An xdist worker's part in the run the controller recorded; its runner is closed with the
    session's config."""
    if "hemra_run_id" not in workerinput:
        raise HemraError("xdist worker got no run id from the controller")
    store = Store(workerinput["hemra_store"])
    config.add_cleanup(store.close)  # after the runner's close (cleanups run in reverse)
    run = load_recorded(store, workerinput["hemra_run_id"])
    runner = Runner(store, run, sandbox_for(run.spec, store, providers(config)), owner_name())
    config.add_cleanup(runner.close)
    workers = int(workerinput.get("workercount", 1))
    return Worker(TrialWork(runner), (), run.dataset_paths, workers=workers)


class Worker:
    """Runs the trials of this process: collects them, starts its lanes, runs each item (again
    after an infrastructure error while retries are left) and stops its lanes at the end.

    `work` is None when nothing is recorded (`--collect-only`): the planned trials are collected
    and nothing runs. An xdist worker is one of `workers`: its lanes are its share of the run's
    concurrency, and xdist's own loop runs the items it is sent, each waiting for its trial;
    without xdist (`reports_in_finish_order`) this worker's loop reports the items as their
    trials finish."""

    def __init__(
        self,
        work: TrialWork | None,
        planned: Sequence[PlannedTrial],
        dataset_paths: dict[str, Path],
        *,
        workers: int = 1,
        reports_in_finish_order: bool = False,
    ) -> None:
        self.work = work
        # made at pytest_configure or pytest_sessionstart, while pytest captures nothing: an
        # install's progress lines, printed from within a trial's item, still reach the user
        keep_stderr()
        self.planned = tuple(planned)
        self.dataset_paths = dataset_paths
        self.workers = workers
        self.reports_in_finish_order = reports_in_finish_order

    def pytest_collection(self, session: pytest.Session) -> bool:
        trials: Sequence[PlannedTrial | TrialRecord] = (
            self.planned if self.work is None else self.work.runner.run.trials
        )
        collect_trials(session, trials, self.dataset_paths, self.work)
        return True

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        trials = [i.nodeid for i in items if isinstance(i, TrialItem)]
        if self.work is not None and trials:
            # every xdist worker deselects the same items: the update is idempotent
            runner = self.work.runner
            runner.store.deselect_trials(runner.run.id, trials)

    def _lane_count(self, config: pytest.Config, runner: Runner) -> int:
        """This process's share of the run's concurrency (`--hemra-concurrency`, else the run's
        `concurrency`): all of it, or under pytest-xdist its part among the workers."""
        wanted = config.getoption("hemra_concurrency") or runner.run.spec.concurrency
        return max(1, math.ceil(wanted / self.workers))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        """With more than one lane, start this process's lanes on its trials; then, without
        pytest-xdist, report the items as their trials finish."""
        work = self.work
        if work is None or session.config.option.collectonly or session.testsfailed:
            return None  # nothing to run; or collection errors (pytest's own loop says so)
        size = self._lane_count(session.config, work.runner)
        items = {
            i.trial.id: i
            for i in session.items
            if isinstance(i, TrialItem) and isinstance(i.trial, TrialRecord)
        }
        if size < 2 or not items:
            return None
        trials = [i.trial for i in items.values() if isinstance(i.trial, TrialRecord)]
        work.lanes = Lanes(work.runner, size).start(trials)
        if not self.reports_in_finish_order:
            return None
        not_trials = [i for i in session.items if i not in items.values()]
        finished = (items[t.id] for t in work.lanes.in_finish_order(trials))  # as each finishes
        run_in_order(session, itertools.chain(not_trials, finished))
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> bool | None:
        if not isinstance(item, TrialItem):
            return None
        run_with_retries(item, nextitem)
        return True

    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        return rerun_status(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Trials still running are recorded: stopped when the session was, else let finish.
        Before the controller's report (its hook is `trylast`), which reads them."""
        lanes = None if self.work is None else self.work.lanes
        if lanes is None:
            return
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            lanes.stop("interrupted (Ctrl-C)")
        elif session.shouldfail or session.shouldstop:
            lanes.stop("the session stopped before its end (-x, --maxfail)")
        else:  # its items done (an xdist worker's: its lanes may run a sibling's trials)
            lanes.stop("the session ended", running=False)

    @pytest.fixture(scope="session")
    def hemra_gateway(self) -> Gateway:
        """The gateway of this pytest process (one per runner process, also per xdist worker)."""
        if self.work is None:
            pytest.fail("hemra_gateway needs a HEMRA session (--hemra-run or --hemra-harness)")
        return self.work.runner.started_gateway()
