"""The pytest face of HEMRA, one plug-in object per role, as pytest-xdist has its `DSession` and
its `WorkerInteractor`:

- `controller.py`: where the run is resolved, recorded and reported (the process pytest was
  started in);
- `worker.py`: where trials run (an xdist worker; without xdist, the controller's process too);
- `items.py`: the collectors and items both collect from the recorded plan;
- `reporter.py`: `hemra run`'s output, a line per trial and the tables (`hemra run` registers it);
- `protocol.py`: the run-test protocol of retries and finish order, the one module that goes past
  pytest's public API.

`pytest_hemra.options` (the `pytest11` entry point) calls `register` only when a run is asked
for. Working a trial's job (claim, heartbeat, run, retry, cancel) is `run.job.Runner`'s.
"""

from __future__ import annotations

import sys

import pytest

from pytest_hemra.core.errors import HemraError
from pytest_hemra.plugin.reporter import OUTPUT

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
        else:
            from pytest_hemra.plugin.controller import open_controller

            manager.register(open_controller(config), CONTROLLER)
    except HemraError as error:
        if manager.has_plugin(OUTPUT):  # `hemra run`: its refusals' one format, no blank lines
            print(f"hemra: {error}", file=sys.stderr)
            raise pytest.UsageError() from None  # pytest prints each of its args: none
        raise pytest.UsageError(str(error)) from None
