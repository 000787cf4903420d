"""Ctrl-C that lands where Python cannot raise it, taken back and delivered again.

A terminal's Ctrl-C signals the whole process group at once: pytest's process and each xdist
worker. Python raises it as `KeyboardInterrupt` wherever the main thread happens to be; in a
finaliser or a weakref callback (run by the garbage collector) it cannot propagate, so Python
prints it as an "Exception ignored in ..." traceback (pytest, as a
`PytestUnraisableExceptionWarning`) and the interrupt itself is lost. `Interrupts` prints
nothing for such an interrupt and delivers it again to the main thread, where the session stops
as on any Ctrl-C; every other unraisable exception goes on to the hook before it (pytest's).
"""

from __future__ import annotations

import _thread
import sys
import time
from typing import Any

import pytest

__all__ = ["INTERRUPTS", "Interrupts"]

INTERRUPTS = "hemra-interrupts"  # the plug-in's name in pytest's plugin manager
AGAIN_AFTER_SECS = 0.05  # the finaliser's hook long returned: it takes microseconds


def deliver_again() -> None:
    """Ctrl-C again, for the main thread (run on a thread of its own)."""
    time.sleep(AGAIN_AFTER_SECS)
    _thread.interrupt_main()


class Interrupts:
    """Installed over pytest's unraisable hook for the session, removed at its end."""

    def __init__(self) -> None:
        self.previous: Any = None

    @pytest.hookimpl(trylast=True)  # after pytest's configure put its own hook in place
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.previous = sys.unraisablehook
        sys.unraisablehook = self.hook

    def hook(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # from another thread, once this hook has returned: asked from the main thread,
            # it would be raised here, in the hook, and printed and lost again
            _thread.start_new_thread(deliver_again, ())
            return
        self.previous(unraisable)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Before pytest's cleanup restores the hook it found."""
        if self.previous is not None and sys.unraisablehook == self.hook:
            sys.unraisablehook = self.previous
