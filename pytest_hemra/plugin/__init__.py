"""The pytest face of HEMRA, one plug-in object per role, as pytest-xdist has its `DSession` and
its `WorkerInteractor`:

- `controller.py`: where the run is resolved, recorded and reported (the process pytest was
  started in);
- `worker.py`: where trials run (an xdist worker; without xdist, the controller's process too);
- `items.py`: the collectors and items both collect from the recorded plan;
- `reporter.py`: `hemra run`'s output, a line per trial and the tables (`hemra run` registers it);
- `interrupt.py`: a Ctrl-C that lands in a finaliser (`core/interrupts.py`), never printed,
  delivered again while the session runs;
- `protocol.py`: the run-test protocol of retries and finish order, the one module that goes past
  pytest's public API.

`pytest_hemra.options` (the `pytest11` entry point) calls `register` only when a run is asked
for. Working a trial's job (claim, heartbeat, run, retry, cancel) is `run.job.Runner`'s.
"""

from __future__ import annotations

import atexit
import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_hemra.core.errors import HemraError
from pytest_hemra.plugin.interrupt import INTERRUPTS, Interrupts
from pytest_hemra.plugin.reporter import OUTPUT

if TYPE_CHECKING:
    from pytest_hemra.resolve.plan import Plan

__all__ = ["CONTROLLER", "WORKER", "register"]

CONTROLLER = "hemra-controller"  # the plug-ins' names in pytest's plugin manager
WORKER = "hemra-worker"


def register(config: pytest.Config) -> None:
    """Register this process's plug-in: a worker in an xdist worker (handed its run through
    `workerinput`), else the controller. The one place the role is decided; hooks never ask.
    (Whether the controller's process runs the trials too, without pytest-xdist, is known
    only once the session starts: `Controller.pytest_sessionstart`.)"""
    manager = config.pluginmanager
    if manager.has_plugin(CONTROLLER) or manager.has_plugin(WORKER):
        return
    workerinput = getattr(config, "workerinput", None)
    try:
        if workerinput is not None:  # an xdist worker imports only what runs trials
            from pytest_hemra.plugin.worker import open_worker

            manager.register(open_worker(config, workerinput), WORKER)
        else:  # resolved before the controller's modules load: a refusal needs none of them
            plan = resolve_session_plan(config)
            from pytest_hemra.plugin.controller import open_controller

            manager.register(open_controller(config, plan), CONTROLLER)
        manager.register(Interrupts(), INTERRUPTS)
        atexit.unregister(_end_without_collecting)  # once, however many sessions a process has
        atexit.register(_end_without_collecting)
    except HemraError as error:
        if manager.has_plugin(OUTPUT):  # `hemra run`: its refusals' one format, no blank lines
            print(f"hemra: {error}", file=sys.stderr)
            raise pytest.UsageError() from None  # pytest prints each of its args: none
        raise pytest.UsageError(str(error)) from None


def _end_without_collecting() -> None:
    """At the interpreter's exit (never before: a process going on after its session, as
    pytester's or `hemra serve`'s, keeps collecting): every object is put out of the garbage
    collector's reach, so the collections of Python's finalisation do not walk the heap a run's
    imports built (SQLAlchemy, pydantic's models, numpy): 0.5 s of each session's and each
    xdist worker's exit on this project's machine (`benchmarks/concurrency.py`). The process
    ends at once; the memory goes with it, and no file is left unwritten (nothing of HEMRA's
    is written by a finaliser)."""
    gc.freeze()


def resolve_session_plan(config: pytest.Config) -> Plan | None:
    """The plan the session's run file and `--hemra-*` options resolve to; None when the session
    takes up a recorded run (`--hemra-resume`)."""
    if config.getoption("hemra_resume"):
        return None
    from pytest_hemra.resolve.overrides import read_overrides
    from pytest_hemra.resolve.plan import resolve_plan

    run_option = config.getoption("hemra_run")
    overrides = read_overrides(lambda flag: config.getoption(flag.dest))
    return resolve_plan(Path(run_option) if run_option else None, overrides, Path.cwd())
