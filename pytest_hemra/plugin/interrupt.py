"""The session's part of `pytest_hemra.core.interrupts`: its filter in front of pytest's
unraisable hook from the session's start (never taken out: pytest puts back, once done, the hook
it found, filtered since `pytest_cmdline_main`), and interrupts delivered again only while the
session runs. SIGTERM (a CI job cancelled, a `kill`) stops the session as Ctrl-C does, where
nothing else of the process handles it: its sandboxes removed, its run left to resume."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from pytest_hemra.core.interrupts import RUNNING, filter_interrupts

__all__ = ["INTERRUPTS", "Interrupts"]

INTERRUPTS = "hemra-interrupts"  # the plug-in's name in pytest's plugin manager


class Interrupts:
    """In front of pytest's unraisable hook from the session's start; never taken out. SIGTERM
    raised as Ctrl-C's `KeyboardInterrupt` while the session runs."""

    def __init__(self) -> None:
        self._sigterm: Any = None  # the handler SIGTERM had before the session, when replaced

    @pytest.hookimpl(trylast=True)  # after pytest's configure put its own hook in place
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        filter_interrupts()
        RUNNING.set()
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        ):  # else someone handles it: theirs
            self._sigterm = signal.signal(signal.SIGTERM, signal.default_int_handler)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        RUNNING.clear()
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
