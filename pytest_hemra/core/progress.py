"""Progress on slow work (a harness install, image builds, a worked run): what is happening and
how far along.

On an interactive terminal, a tqdm bar kept up to date; in CI and logs (stderr not a terminal),
a plain line when the step starts, one every `HEMRA_PROGRESS_SECS` seconds while it lasts, and
one when it ends. Lines go to stderr: pytest captures a test's stdout and stderr, so a session
keeps this process's stderr first (`keep_stderr`), and an xdist worker's lines (whose stdout is
its channel to the controller, its stderr the terminal's) reach the user as well.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

PROGRESS_VARIABLE = "HEMRA_PROGRESS_SECS"
DEFAULT_SECS = 15.0
REFRESH_SECS = 1.0  # how often a bar's elapsed time is redrawn when nothing advances

_kept: TextIO | None = None


def keep_stderr() -> None:
    """Send progress to this process's stderr as it is now, before pytest captures it (once;
    called where a session's trials are set up, while pytest's capture is suspended)."""
    global _kept
    if _kept is None:
        _kept = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")


def progress_stream() -> TextIO:
    return _kept if _kept is not None else sys.stderr


def progress_secs() -> float:
    """Seconds between plain progress lines: `HEMRA_PROGRESS_SECS`, else DEFAULT_SECS."""
    found = os.environ.get(PROGRESS_VARIABLE, "").strip()
    try:
        secs = float(found) if found else DEFAULT_SECS
    except ValueError:
        return DEFAULT_SECS
    return secs if secs > 0 else DEFAULT_SECS


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """One slow step: `with Progress("installing aider", total=None) as step: ...`, calling
    `step.advance()` (or `step.update(done, detail)`) as parts of `total` finish. A step with
    no total says how long it has taken."""

    def __init__(self, what: str, total: int | None = None, unit: str = "") -> None:
        self.what = what
        self.total = total
        self.unit = unit
        self.done = 0
        self.detail = ""
        self.stream = progress_stream()
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._bar: Any = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        self.started = time.monotonic()
        if _is_terminal(self.stream):
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(
                desc=f"hemra: {self.what}",
                total=self.total,
                unit=self.unit or "it",
                file=self.stream,
                leave=True,
                ncols=min(shutil.get_terminal_size().columns, 120),  # a pty of size 0: 80
            )
            self._thread = threading.Thread(
                target=self._refresh, name="hemra-progress", daemon=True
            )
        else:
            self._line(self._state(is_start=True))
            self._thread = threading.Thread(target=self._tick, name="hemra-progress", daemon=True)
        self._thread.start()
        return self

    def advance(self, count: int = 1, detail: str = "") -> None:
        self.update(self.done + count, detail)

    def update(self, done: int, detail: str = "", total: int | None = None) -> None:
        """`done` of `total` finished (a new `total` when given: a run's trials retried);
        `detail` what the last one was, or what is going on."""
        with self._lock:
            step, self.done, self.detail = done - self.done, done, detail
            if total is not None and total != self.total:
                self.total = total
                if self._bar is not None:
                    self._bar.total = total
            if self._bar is not None:
                if detail:
                    self._bar.set_postfix_str(detail, refresh=False)
                self._bar.update(step)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
        else:
            ending = "failed" if kind is not None else "done"
            self._line(f"{ending} in {self._elapsed()}{self._counted()}")

    def _state(self, is_start: bool = False) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        when = "started" if is_start else f"{self._elapsed()} so far"
        return f"{when}{self._counted()}{detail}"

    def _counted(self) -> str:
        if self.total is None:
            return f", {self.done} {self.unit}".rstrip() if self.done else ""
        return f", {self.done} of {self.total}{' ' + self.unit if self.unit else ''}"

    def _elapsed(self) -> str:
        secs = time.monotonic() - self.started
        return f"{secs:.0f}s" if secs < 120 else f"{secs // 60:.0f}m{secs % 60:02.0f}s"

    def _tick(self) -> None:
        every = progress_secs()
        while not self._stop.wait(every):
            with self._lock:
                self._line(self._state())

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_SECS):
            with self._lock:
                self._bar.refresh()

    def _line(self, state: str) -> None:
        # the stream gone (a closed pipe): progress is not worth failing the work for
        with contextlib.suppress(OSError, ValueError):
            print(f"hemra: {self.what}: {state}", file=self.stream, flush=True)
