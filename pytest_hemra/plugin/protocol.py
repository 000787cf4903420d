"""HEMRA's own run-test protocol: the one place the pytest face goes past pytest's public API.

pytest's public hooks run an item's setup, call and teardown and log each report as it is made
(`pytest_runtest_protocol`), one item after another in collection order. A trial needs two
things they do not give:

- **Retries held back.** A trial retried after an infrastructure error is one test case (one
  JUnit testcase) whatever its retries: each attempt's phases run with their reports held back,
  then the attempts before the last are logged as `rerun` and only the last as its outcome.
  pytest has no public way to run an item's phases without logging them, so `run_phases` calls
  the private `_pytest.runner.runtestprotocol(log=False)`, as pytest-rerunfailures does; an
  outcome of `rerun` is outside `TestReport.outcome`'s type, as there too.
- **Finish order.** Trials running several at once (lanes) are reported as each finishes, not
  in collection order, so `run_in_order` is the session's loop over items in an order known
  only as it goes, each told which item runs next.

Nothing else in the face imports `_pytest`.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from _pytest.runner import runtestprotocol

from pytest_hemra.plugin.items import TrialItem

RERUN = "rerun"


def run_phases(item: pytest.Item, nextitem: pytest.Item | None) -> list[pytest.TestReport]:
    """An item's setup, call and teardown reports, not yet logged."""
    return runtestprotocol(item, nextitem=nextitem, log=False)


def run_with_retries(item: TrialItem, nextitem: pytest.Item | None) -> None:
    """Run a trial, and again after an infrastructure error while retries are left: each
    retry is a new attempt row, its predecessor's setup logged as `rerun`, and the trial is one
    test case whatever the retries."""
    hook = item.ihook
    hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    while True:
        reports = run_phases(item, nextitem)
        retry = item.next_attempt()
        if retry is None:
            break
        for report in reports:
            if report.when == "setup":
                report.outcome = RERUN  # type: ignore[assignment]
                hook.pytest_runtest_logreport(report=report)
        item.trial = retry
    for report in reports:
        hook.pytest_runtest_logreport(report=report)
    hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def rerun_status(report: pytest.TestReport) -> tuple[str, str, str] | None:
    """`pytest_report_teststatus` for a held-back attempt (here and on an xdist controller,
    which logs its workers' reports)."""
    if report.outcome == RERUN:
        return RERUN, "R", RERUN.upper()
    return None


def run_in_order(session: pytest.Session, items: Iterable[pytest.Item]) -> None:
    """The session's loop over its items, in the order `items` yields them (each as its trial
    finishes). Which item runs next is known only when its trial finishes: an item of another
    dataset, if any is left, tears this one's dataset down (pytest's setup state holds one
    dataset at a time, and a trial of any dataset may finish next)."""
    left = dict.fromkeys(session.items)
    for item in items:
        del left[item]
        others = (i for i in left if i.parent is not item.parent)
        nextitem = next(others, next(iter(left), None))
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
