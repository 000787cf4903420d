"""Every wait has a deadline: the install lock and an item's wait on its lane give up naming
what they waited for; and what the plugin imports leaves the heavy statistics out."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from conftest import TaskMaker
from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute import builds
from pytest_hemra.execute.installs import locked
from pytest_hemra.resolve.datasets import load_task
from pytest_hemra.run import lanes, trial
from pytest_hemra.run.lanes import Lanes


def test_an_install_lock_held_elsewhere_is_given_up_at_its_deadline_naming_the_install(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pkg.lock"
    with path.open("w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        waited = r"waited 0.3s for another process installing npm:x"
        with pytest.raises(InfraError, match=waited), locked(path, "npm:x", timeout=0.3):
            pass
        assert time.monotonic() - started < 5
    with locked(path, "npm:x", timeout=0.3):
        pass  # free again: had at once


def test_an_item_whose_lane_never_returns_fails_at_the_lane_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes, "LANE_WAIT_SECS", 0.5)
    lane = Lanes(runner=cast(Any, None), size=1)
    try:
        never: Future[str | None] = Future()
        lane.started["t1"] = time.monotonic()
        with pytest.raises(InfraError, match=r"t1: its lane did not finish it in 0.5s"):
            lane._result("t1", never)
        finished: Future[str | None] = Future()
        finished.set_result("done")
        assert lane._result("t2", finished) == "done"  # not started: no deadline yet, answered
    finally:
        lane.pool.shutdown()


def test_trials_in_finish_order_are_not_waited_for_past_the_lane_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lane that never finishes does not hold the finish-order loop: past the deadline the
    trials left come in the plan's order, each then waited for by its own deadline."""
    monkeypatch.setattr(lanes, "LANE_WAIT_SECS", 0.3)
    lane = Lanes(runner=cast(Any, None), size=1)
    try:
        never: Future[str | None] = Future()
        done: Future[str | None] = Future()
        done.set_result("done")
        trials = [cast(Any, SimpleNamespace(id=name)) for name in ("a", "b", "c")]
        lane.futures.update({"a": never, "b": done})
        started = time.monotonic()
        assert [t.id for t in lane.in_finish_order(trials)] == ["c", "b", "a"]
        assert time.monotonic() - started < 5
    finally:
        lane.pool.shutdown()


def test_the_plugin_loads_neither_pandas_nor_scipy_nor_statsmodels() -> None:
    """statsmodels (and pandas, which sqlite_utils imports when it is installed) and scipy load
    where the statistics need them, not in every process that opens the store."""
    heavy = ["pandas", "scipy", "statsmodels"]
    assert loaded_after("pytest_hemra.plugin, pytest_hemra.report.tables", heavy) == "[]"


def test_an_xdist_worker_imports_no_report_statistics_or_templates() -> None:
    """A worker runs trials: the report, its statistics and templates load where the summary is
    made (the controller), not in each of `-n`'s workers."""
    heavy = ["numpy", "scipy", "jinja2", "tabulate", "pytest_hemra.report.tables"]
    heavy += ["pytest_hemra.plugin.controller", "pytest_hemra.report.comparison"]
    assert loaded_after("pytest_hemra.plugin.worker", heavy) == "[]"


def loaded_after(modules: str, heavy: list[str]) -> str:
    """Which of `heavy` a fresh interpreter has loaded once it imported `modules`, printed."""
    probe = f"import sys, {modules}; print([name for name in {heavy!r} if name in sys.modules])"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_image_builds_that_never_end_are_given_up_at_their_deadline(
    monkeypatch: pytest.MonkeyPatch, make_task: TaskMaker
) -> None:
    release = threading.Event()
    provider = SimpleNamespace(prepare=lambda task, image: release.wait(60))  # a build that hangs
    task = load_task(make_task("slow-image"))
    assert builds.build_deadline_secs([task]) == 2 * 600 + builds.BUILD_MARGIN_SECS  # finite
    monkeypatch.setattr(builds, "build_deadline_secs", lambda tasks: 0.3)
    started = time.monotonic()
    try:
        with pytest.raises(InfraError, match=r"image builds did not finish within 0.3s"):
            builds._prepare_all(cast(Any, provider), [task], "", 1)
        assert time.monotonic() - started < 5
    finally:
        release.set()


def test_tamper_evidence_that_never_comes_is_an_infra_error_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trial, "TAMPER_WAIT_SECS", 0.2)
    never: Future[list[str]] = Future()
    with pytest.raises(InfraError, match=r"diff of the sandbox did not come within 0.2s"):
        trial._tamper_evidence(never)
    done: Future[list[str]] = Future()
    done.set_result(["/usr/bin/cat: changed"])
    assert trial._tamper_evidence(done) == ["/usr/bin/cat: changed"]
