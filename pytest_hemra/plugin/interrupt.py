"""The session's part of `pytest_hemra.core.interrupts`: its filter in front of pytest's
unraisable hook from the session's start (never taken out: pytest puts back, once done, the hook
it found, filtered since `pytest_cmdline_main`), and interrupts delivered again only while the
session runs."""

from __future__ import annotations

import pytest

from pytest_hemra.core.interrupts import RUNNING, filter_interrupts

__all__ = ["INTERRUPTS", "Interrupts"]

INTERRUPTS = "hemra-interrupts"  # the plug-in's name in pytest's plugin manager


class Interrupts:
    """In front of pytest's unraisable hook from the session's start; never taken out."""

    @pytest.hookimpl(trylast=True)  # after pytest's configure put its own hook in place
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        filter_interrupts()
        RUNNING.set()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        RUNNING.clear()
