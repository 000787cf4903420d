"""The items of a HEMRA session: one collector per dataset, one item per trial, collected in
the plan's order from the recorded run (or, under `--collect-only`, from the plan itself), the
same in every process that collects them.

An item works its trial through the `TrialWork` of the process that collected it: its runner,
and the lanes when the process runs several trials at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_hemra.core.errors import StoreUnavailable
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import PlannedTrial, TrialRecord
from pytest_hemra.core.reward import shown_reward
from pytest_hemra.core.text import printable
from pytest_hemra.core.usage import Usage
from pytest_hemra.run.job import Runner
from pytest_hemra.run.lanes import Lanes, settle


@dataclass
class TrialWork:
    """How this process brings its items' trials to their results: its runner, and its lanes
    once they are started (`run/lanes.py`)."""

    runner: Runner
    lanes: Lanes | None = None

    def settle(self, trial: TrialRecord) -> TrialRecord | str:
        """The trial's result: run here, or by another runner, or by the row that took it over
        from a runner that is gone (`run/lanes.settle`); without lanes, not waited for."""
        if self.lanes is None:
            return settle(self.runner, trial, self.runner.work, wait=False)
        return self.lanes.work(trial)


def collect_trials(
    session: pytest.Session,
    trials: Sequence[PlannedTrial | TrialRecord],
    dataset_paths: Mapping[str, Path],
    work: TrialWork | None,
) -> None:
    """`pytest_collection`'s work for a HEMRA session: the trials' items, in the plan's order,
    through the same hooks pytest's own collection calls (so `-k`, `--deselect` and the
    reports behave as for any collector)."""
    hook = session.config.hook
    hook.pytest_collectstart(collector=session)
    items: list[pytest.Item] = []
    for dataset in dict.fromkeys(t.dataset for t in trials):
        node = DatasetCollector.from_parent(
            session,
            name=dataset,
            nodeid=dataset,
            path=dataset_paths[dataset],
            trials=[t for t in trials if t.dataset == dataset],
            work=work,
        )
        report = hook.pytest_make_collect_report(collector=node)
        hook.pytest_collectreport(report=report)
        items.extend(x for x in report.result if isinstance(x, pytest.Item))
    session.items = items
    hook.pytest_collection_modifyitems(session=session, config=session.config, items=items)
    hook.pytest_collection_finish(session=session)
    session.testscollected = len(items)


class DatasetCollector(pytest.Collector):
    def __init__(
        self,
        *,
        trials: list[PlannedTrial | TrialRecord],
        work: TrialWork | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.trials = trials
        self.work = work

    def collect(self) -> list[pytest.Item]:
        return [
            TrialItem.from_parent(
                self,
                name=f"{t.task}[{t.cell}-{t.attempt}]",
                path=self.path / t.task,
                trial=t,
                work=self.work,
            )
            for t in self.trials
        ]


class TrialItem(pytest.Item):
    """One trial: the sandbox work happens in setup (so infrastructure faults are errors),
    the verdict in the call phase (so a failing harness is a failed test).

    The verdict always comes from the trial's row in the store, written before it is reported:
    a trial finished by an earlier session (`--hemra-resume`) is reported without running."""

    def __init__(
        self, *, trial: PlannedTrial | TrialRecord, work: TrialWork | None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.trial = trial
        self.work = work
        self.record: TrialRecord | None = None
        models = {trial.model, trial.cell} if trial.model is not None else set()
        self.extra_keyword_matches.update({trial.task, trial.harness, trial.dataset, *models})

    def setup(self) -> None:
        trial = self.trial
        if self.work is None or not isinstance(trial, TrialRecord):
            pytest.fail("hemra: this session recorded no run", pytrace=False)
        self.user_properties.clear()
        self.record = None
        try:
            settled = self.work.settle(trial)
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
        if self.work is None or self.record is None:
            return None
        return self.work.runner.next_attempt(self.record)

    def _verdict(self, record: TrialRecord) -> str:
        reward = shown_reward(record.outcome, record.reward)
        detail = f": {printable(record.error)}" if record.error else ""
        exit_code = "" if record.exit_code in (0, None) else f", exit code {record.exit_code}"
        return f"{record.outcome} ({reward}{exit_code}){detail} - see {record.trial_dir}"

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name
