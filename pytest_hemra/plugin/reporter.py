"""`hemra run`'s output: a line per trial as it finishes and the HEMRA tables, in place of
pytest's session header, progress dots, FAILURES section and "1 failed, 1 passed" (a trial
that fails its task is a result, not a failed test).

`hemra run` hands pytest an `Output` (`pytest.main(argv, plugins=[Output()])`); `-v` (or
`-- -v`) and `--collect-only` keep pytest's own reporter, as plain `pytest --hemra-run` does.
The quiet reporter is pytest's `TerminalReporter` with the parts above left out, registered
under its name the way pytest-sugar registers its own: the summary hooks every plug-in writes
to (the controller's tables, junitxml's file, the warnings summary) run unchanged. Under
pytest-xdist the controller's process gets its workers' reports through the same hooks.
A report of HEMRA's own fault (an item that raised, a collection error) is still shown in full;
a warning about HEMRA's input is a `hemra: warning: ...` line; after Ctrl-C pytest's
`!!! KeyboardInterrupt !!!` and traceback are left out (the controller says how to go on).
"""

from __future__ import annotations

import warnings
from typing import Any, cast

import pytest

from pytest_hemra.core.errors import InputWarning
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.text import printable
from pytest_hemra.core.words import plural

OUTPUT = "hemra-output"  # the plug-in's name in pytest's plugin manager

DESELECTED = "deselected"  # pytest's stats key (-k, -m): not a lifecycle state
_COLOURS: dict[str, str] = {Outcome.PASS: "green", Outcome.FAIL: "red", Outcome.CANCELLED: "yellow"}


class Output:
    """The `hemra run` session's plug-in: it swaps pytest's terminal reporter for the quiet
    one, and tells the HEMRA plug-in (by being registered) that a refusal is printed as
    `hemra: ...`, not as pytest's `ERROR: ...`."""

    __name__ = OUTPUT  # pluggy names an object by its `__name__`: found by `get_plugin(OUTPUT)`

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        manager = config.pluginmanager
        standard = manager.get_plugin("terminalreporter")
        if standard is None or config.get_verbosity() > 0 or config.getoption("collectonly"):
            return
        manager.unregister(standard)
        manager.register(TrialLines(config), "terminalreporter")


def properties(report: pytest.TestReport) -> dict[str, str]:
    """The trial's properties a report carries (as text: xdist sends them as such)."""
    return {name: str(value) for name, value in getattr(report, "user_properties", ())}


def is_result(report: pytest.TestReport) -> bool:
    """Whether a report carries a trial's result (its `outcome` property), rather than a fault."""
    return "outcome" in properties(report)


def skip_reason(report: pytest.TestReport) -> str:
    """Why a trial was not run here (the item's skip: left queued for a worker with a key,
    stopped, running elsewhere), as pytest's `-rs` would say it."""
    found = report.longrepr
    text = found[2] if isinstance(found, tuple) and len(found) == 3 else str(found)
    return printable(str(text).removeprefix("Skipped: "))


class TrialLines(pytest.TerminalReporter):  # type: ignore[misc]  # final: pytest-sugar does so
    """pytest's terminal reporter, with a line per finished trial instead of dots and failures."""

    def __init__(self, config: pytest.Config) -> None:
        super().__init__(config)
        self._show_progress_info = False
        self.finished = 0

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """The run's line, in place of pytest's header (its start time is for the "in 2.73s" of
        the summary line, which is not printed)."""
        from pytest_hemra.plugin import CONTROLLER

        self._session = session
        controller = self.config.pluginmanager.get_plugin(CONTROLLER)
        for line in (controller.pytest_report_header() if controller else None) or []:
            self.write_line(line)

    def report_collect(self, final: bool = False) -> None:
        pass

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """pytest's "collected 4 items / 2 deselected", said of trials."""
        deselected = len(self.stats.get(DESELECTED, []))
        if deselected:
            total = plural(self._numcollected, "trial")
            self.write_line(f"hemra: {deselected} of {total} left out by the selection (-k, -m)")

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        pass

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        category, _letter, _word = self.config.hook.pytest_report_teststatus(
            report=report, config=self.config
        )
        self._add_stats(category, [report])
        # typed set[str] before pytest 9.2, set[NodeId] since
        cast(Any, self._progress_nodeids_reported).add(report.nodeid)
        finished = report.when == "call" or (
            report.when == "setup" and report.outcome in ("failed", "skipped")
        )
        if finished and is_result(report):
            self.finished += 1
            outcome = properties(report)["outcome"]
            self.write_line(self.trial_line(report), **{_COLOURS.get(outcome, "red"): True})
        elif report.skipped and report.when == "setup":  # not run here (left queued, stopped)
            self.write_line(f"{report.nodeid}: not run: {skip_reason(report)}", yellow=True)
        elif report.failed and not is_result(report):
            self.write_line(f"{report.nodeid}: error (below)", red=True)

    def trial_line(self, report: pytest.TestReport) -> str:
        """`[ 2/14]  fail  hemra-offline::create-file  nop  attempt 1  reward 0  0.88s`: the
        count as wide as the total, so that the columns after it stay in line."""
        found = properties(report)
        outcome = found.get("outcome", report.outcome)
        where, _, name = report.nodeid.rpartition("::")
        task, _, cell_attempt = name.partition("[")
        cell, _, attempt = cell_attempt.rstrip("]").rpartition("-")
        total = self._session.testscollected if self._session is not None else 0
        deselected = len(self.stats.get(DESELECTED, []))
        of = max(total - deselected, self.finished)
        parts = [f"[{self.finished:>{len(str(of))}}/{of}]", f"{outcome:<11}"]  # columns kept
        parts += [f"{where}::{task}" if where else task, cell, f"attempt {attempt}"]
        if found.get("reward"):
            parts.append(f"reward {found['reward']}")
        if found.get("duration"):
            parts.append(f"{float(found['duration']):.2f}s")
        if outcome not in ("pass", "fail") and report.longrepr is not None:
            detail = str(getattr(report.longrepr, "reprcrash", None) or report.longrepr)
            parts.append("- " + printable(detail.splitlines()[-1] if detail else ""))
        return "  ".join(part for part in parts if part)

    def pytest_warning_recorded(
        self, warning_message: warnings.WarningMessage, nodeid: str
    ) -> None:
        """HEMRA's warnings about its input (a task.toml key it ignores) as `hemra: warning: ...`
        lines, where pytest's summary would name the line of HEMRA that issued them."""
        if issubclass(warning_message.category, InputWarning):
            message = printable(str(warning_message.message))
            self.write_line(f"hemra: warning: {message}", yellow=True)
        else:
            super().pytest_warning_recorded(warning_message, nodeid)

    def getreports(self, name: str) -> list[Any]:
        return [report for report in super().getreports(name) if not is_result(report)]

    def short_test_summary(self) -> None:
        pass

    def summary_stats(self) -> None:
        pass

    def _report_keyboardinterrupt(self) -> None:
        pass  # the controller's summary says how to go on; pytest's traceback says nothing
