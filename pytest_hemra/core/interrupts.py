"""Ctrl-C that lands where Python cannot raise it: never printed, and delivered again while a
HEMRA session runs.

A terminal's Ctrl-C signals the whole process group at once: pytest's process and each xdist
worker. Python raises it as `KeyboardInterrupt` wherever the main thread happens to be; in a
finaliser or a weakref callback (run by the garbage collector, busiest while a session tears
down) it cannot propagate, so Python prints it as an "Exception ignored in ..." traceback
(pytest, as a `PytestUnraisableExceptionWarning`) and the interrupt itself is lost.

`filter_interrupts` puts a hook in front of the unraisable hook in place that takes such an
interrupt back: nothing printed, and, while the session runs, delivered again to the main thread,
where the session stops as on any Ctrl-C (once it is ending, it ends anyway). Every other
unraisable exception goes on to the hook behind it. It is put in place twice: before pytest's
own hook is (`pytest_hemra.options`' `pytest_cmdline_main`: so what pytest puts back when it is
done is still filtered), and in front of pytest's once the session starts
(`pytest_hemra.plugin.interrupt.Interrupts`), staying there while pytest collects what is left
at its end.
"""

from __future__ import annotations

import _thread
import sys
import threading
import time
from typing import Any

__all__ = ["AGAIN_AFTER_SECS", "RUNNING", "deliver_again", "filter_interrupts"]

AGAIN_AFTER_SECS = 0.05  # the finaliser's hook long returned: it takes microseconds
RUNNING = threading.Event()  # a HEMRA session of this process has started and not yet ended
FILTERS = "hemra_filters_interrupts"  # the attribute that marks a hook as this module's


def filter_interrupts() -> None:
    """The unraisable hook in place, with a `KeyboardInterrupt` filter in front (unless its
    front already is one)."""
    behind = sys.unraisablehook
    if getattr(behind, FILTERS, False):
        return

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            if RUNNING.is_set():
                # from another thread, once this hook has returned: asked from the main
                # thread, it would be raised here, in the hook, and printed and lost again
                _thread.start_new_thread(deliver_again, ())
            return
        behind(unraisable)

    setattr(hook, FILTERS, True)
    sys.unraisablehook = hook


def deliver_again() -> None:
    """Ctrl-C again, for the main thread (run on a thread of its own), if the session still
    runs."""
    time.sleep(AGAIN_AFTER_SECS)
    if RUNNING.is_set():
        _thread.interrupt_main()
