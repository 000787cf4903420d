"""How many sandboxes a runner starts on an engine at once: an engine's own backpressure.

An engine asked to start many containers at once answers each start later and later (on this
2-core machine, a median of 14 s at 64 at once, against 0.25 s alone), until some answers come
after the client's read timeout although the engine still answers pings at once. Such an
engine is busy, not gone: the runner lowers how many starts it has in flight there, and the
trial is run again without using up a retry (`Cause.ENGINE_BUSY`); only an engine that stops
answering is an outage (`run/outage.py`).

The limit adapts as TCP's window does (additive increase, multiplicative decrease): a start
answered within HEMRA_START_SLOW_SECS raises it by one over the limit (about one a round of
starts); a slower answer, or none in time, halves it, at most once a round (many starts slowed
by one burst halve it once, not to 1). One `Admission` an engine a process, shared by its lanes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pytest_hemra.core.backoff import start_slow_secs
from pytest_hemra.execute.sandbox.health import is_slow_answer

INITIAL = 16.0  # starts in flight on an engine before any has been answered
CEILING = 1024.0


class Admission:
    """One engine's starts in flight from this process, under an adaptive limit."""

    def __init__(self, slow: float, initial: float = INITIAL) -> None:
        self.slow = slow
        self.limit = initial
        self.in_flight = 0
        self.decreased_at = float("-inf")  # (monotonic) when the limit was last halved
        self._changed = threading.Condition()

    @contextmanager
    def start(self) -> Iterator[None]:
        """A start on the engine: waits while the limit's worth are in flight, then measures
        how long the engine takes to answer it (an exception's own kind: a read timeout is
        the engine's slowness, anything else the start's own failure)."""
        with self._changed:
            while self.in_flight >= int(self.limit):
                self._changed.wait()
            self.in_flight += 1
        began = time.monotonic()
        slowed = False
        try:
            yield
        except BaseException as error:
            slowed = is_slow_answer(error)
            raise
        finally:
            took = time.monotonic() - began
            self._answered(began, slowed or took > self.slow)

    def _answered(self, began: float, slowed: bool) -> None:
        with self._changed:
            self.in_flight -= 1
            if not slowed:
                self.limit = min(CEILING, self.limit + 1.0 / self.limit)
            elif began > self.decreased_at:  # once a round: starts begun before the last cut
                self.limit = max(1.0, self.limit / 2)
                self.decreased_at = time.monotonic()
            self._changed.notify_all()


_admissions: dict[str, Admission] = {}
_lock = threading.Lock()


def admission(engine: str) -> Admission:
    """The process's admission of starts on `engine` (its address), made on first use."""
    with _lock:
        found = _admissions.get(engine)
        if found is None:
            found = _admissions[engine] = Admission(start_slow_secs())
        return found
