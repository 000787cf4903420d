"""Outages a runner waits out instead of spending a trial's retries on them: its Docker engine not
answering (a daemon stopped, killed or restarting), and its store unwritable (the disk of the
store's folder full, or the store locked by another process past its timeout).

An engine outage: the runner pings the engine with exponential backoff and jitter
(`core/backoff.py`), the trial's job still leased (so `hemra runs` and the viewer show its run
waiting, from the `engine_down` event), until the engine answers; then what the outage left
there (this trial's sandbox, and those of trials that are over) is removed, `engine_back` is
recorded, and the trial runs again without using up a retry. Past the give-up total the trial
ends `infra_error` of class `engine_gone` (`engine_gone` recorded), and later trials of this
process that find the engine still down end so at once: the run stops and `--resume` finishes it.

A store write that cannot be made for now is tried again on the same backoff until it is
made (then `store_wait` is recorded) or the give-up total passes (`StoreUnavailable`, and the
session stops: `--resume` finishes the run).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pytest_hemra.core.backoff import SETTLE_POLL_SECS, Backoff, store_backoff
from pytest_hemra.core.errors import StoreUnavailable, causes
from pytest_hemra.core.events import ENGINE_BACK, ENGINE_DOWN, ENGINE_GONE, STORE_WAIT
from pytest_hemra.core.progress import Progress
from pytest_hemra.execute.sandbox import SandboxPool, SandboxProvider
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive

T = TypeVar("T")
MIN_FREE_BYTES = 1 << 20  # a folder with less than this free cannot take a trial's results
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
MONITOR_SECS = 0.5  # how often a runner pings its engine while it lives
POOL = "of [[sandbox.engines]]"  # what the waits of a pool's trials name when no engine answers


@dataclass(frozen=True)
class WaitResult:
    """How waiting for an engine ended: back (after `waited` seconds, `removed` leftover
    sandboxes), given up on, or cut short by a cancel."""

    engine: str
    is_back: bool
    waited: float
    error: str | None
    removed: int = 0
    is_cancelled: bool = False

    def note(self) -> str:
        """One line for the trial's error: what happened to its engine."""
        if self.is_back:
            return (
                f"engine {self.engine} stopped answering; waited {self.waited:.1f}s for an"
                " engine to answer again"
            )
        return (
            f"engine {self.engine} did not answer for {self.waited:.0f}s, given up"
            f" (HEMRA_ENGINE_GIVE_UP_SECS): {self.error}"
        )


class EngineWatch:
    """One runner's watch on its sandbox provider's engine: a thread pings it every
    MONITOR_SECS, so an engine that went away and came back between two of a trial's requests
    (a quick restart) is still seen to have gone (`was_down_since`). Remembers giving up on it,
    so that later trials of the process do not each wait the whole give-up total again."""

    def __init__(
        self, provider: SandboxProvider, store: Store, backoff: Backoff, settle_secs: float = 0.0
    ) -> None:
        self.health = provider
        self.engine = provider.engine or POOL  # a single engine's address
        self.store = store
        self.backoff = backoff
        self.settle_secs = settle_secs  # how long it must answer to be back (not going down)
        self.gone: str | None = None  # why this process gave up on the engine
        self.last_down = float("-inf")  # (monotonic) when a ping last found it down
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> EngineWatch:
        """Start pinging the engine in a thread (a daemon: it ends with the process)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._monitor, name="hemra-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(MONITOR_SECS * 4)
            self._thread = None

    def _monitor(self) -> None:
        while not self._stop.wait(MONITOR_SECS):
            with contextlib.suppress(Exception):  # a ping that cannot even be made: next one
                self.error()

    def was_down_since(self, since: float) -> bool:
        """Whether a ping found the engine down after `since` (monotonic)."""
        return self.last_down >= since

    def error(self, engine: str | None = None) -> str | None:
        """None when the engine answers now (or the provider cannot say), else why not; a
        pool's `engine` by name, else any of its engines."""
        found = self.health.engine_error(engine)
        if found is not None:
            self.last_down = time.monotonic()
        return found

    def sweep(self) -> int:
        """What trials of this store that are over left on the engine (a daemon restarted, a
        cancel while it was down), removed: when a runner first reaches it."""
        if self.error() is not None:
            return 0
        return self._remove_leftovers(None)

    def wait(
        self,
        run_id: str,
        trial: str,
        stop: threading.Event,
        error: str | None,
        engine: str | None = None,
    ) -> WaitResult:
        """Wait for the engine to answer, and keep answering for `settle_secs` (a daemon shutting
        down still answers pings for a moment while it cuts other requests), recording
        `engine_down` first; then remove what the outage left. Or give up. `stop` (the trial
        cancelled) ends the wait early. `engine` names the one a pool lost the trial on (the
        wait is for any of the pool's)."""
        name = engine or self.engine
        started = time.monotonic()

        def event(kind: str, **data: object) -> None:
            durably(
                self.store,
                lambda: self.store.record_event(run_id, trial, kind, {"engine": name, **data}),
            )

        event(ENGINE_DOWN, error=error)
        last = error
        if self.gone is None:
            with Progress(f"trial {trial}: waiting for engine {name} to answer") as step:
                for delay in self.backoff.delays():
                    last = self.error()
                    if last is None:
                        last = settled(self.health, None, self.settle_secs)
                    if last is None:
                        break
                    step.update(0, str(last)[:120])
                    waited = time.monotonic() - started
                    if waited + delay > self.backoff.give_up_secs:
                        break
                    if stop.wait(delay):
                        waited = round(time.monotonic() - started, 3)
                        return WaitResult(name, False, waited, last, is_cancelled=True)
        else:
            last = self.error()
        waited = round(time.monotonic() - started, 3)
        if last is not None:
            self.gone = last
            event(ENGINE_GONE, waited=waited, error=last)
            return WaitResult(name, False, waited, last)
        self.gone = None
        removed = self._remove_leftovers(trial)
        event(ENGINE_BACK, waited=waited, removed=removed)
        return WaitResult(name, True, waited, error, removed)

    def _remove_leftovers(self, trial: str | None) -> int:
        """This trial's sandbox (its teardown could not reach the engine), and what trials
        that are over left; a removal the engine refuses now is left for the next one."""
        health = self.health
        store = self.store
        with contextlib.suppress(Exception):
            return health.remove_leftovers(lambda t: t == trial or store.is_trial_over(t, is_alive))
        return 0


def settled(provider: SandboxProvider | SandboxPool, engine: str | None, secs: float) -> str | None:
    """After an error the engine's API returned: None when the engine (a pool's `engine`) keeps
    answering for `secs` (the error was the trial's own), else why it stopped answering (it was
    going away: a daemon told to stop stops the trial's container and answers on connections
    already open until it exits, but no ping reaches it, each being on a new connection)."""
    deadline = time.monotonic() + secs
    while True:
        error = provider.engine_error(engine)
        if error is not None or time.monotonic() >= deadline:
            return error
        time.sleep(SETTLE_POLL_SECS)


def durably(
    store: Store,
    write: Callable[[], T],
    backoff: Backoff | None = None,
    where: tuple[str | None, str | None] = (None, None),
) -> T:
    """Make a store write, waiting out a full disk or a lock held too long (the same backoff,
    HEMRA_STORE_GIVE_UP_SECS in all); `store_wait` is recorded (for run and trial `where`)
    once it is made. Raises `StoreUnavailable` when the give-up total passes."""
    waits = backoff or store_backoff()
    started: float | None = None
    delays: Iterator[float] = waits.delays()
    while True:
        try:
            done = write()
        except StoreUnavailable as error:
            now = time.monotonic()
            started = now if started is None else started
            delay = next(delays)
            if now - started + delay > waits.give_up_secs:
                raise StoreUnavailable(
                    f"{error} (for {now - started:.0f}s, HEMRA_STORE_GIVE_UP_SECS"
                    f" {waits.give_up_secs:g})"
                ) from error
            last = str(error)
            time.sleep(delay)
            continue
        if started is not None:
            waited = round(time.monotonic() - started, 3)
            with contextlib.suppress(StoreUnavailable):
                store.record_event(*where, STORE_WAIT, {"waited": waited, "error": last})
        return done


def is_runner_disk_full(error: BaseException, folder: Path) -> bool:
    """Whether `error`, or one it was raised from or while handling, is the disk of `folder`
    being full: a failed write naming a file on that disk (full then, whatever it is now), or
    one naming no file while that disk is full still."""
    device = _device(folder)
    for found in causes(error):
        if not isinstance(found, OSError) or found.errno not in DISK_FULL_ERRNOS:
            continue
        named = [n for n in (found.filename, found.filename2) if isinstance(n, str | bytes)]
        if named and any(_device(Path(os.fsdecode(name))) == device for name in named):
            return True
        if not named and not has_space(folder):
            return True
    return False


def _device(path: Path) -> int:
    """The device of `path`'s filesystem (or of its nearest existing parent's)."""
    return os.stat(_existing(path)).st_dev


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def has_space(folder: Path) -> bool:
    """Whether the disk of `folder` (or its nearest existing parent) can take more files."""
    found = os.statvfs(_existing(folder))
    if found.f_bavail * found.f_frsize < MIN_FREE_BYTES:
        return False
    return found.f_files == 0 or found.f_favail > 0


def write_durably(path: Path, text: str, backoff: Backoff | None = None) -> None:
    """Write a file, waiting for space when its disk is full (HEMRA_STORE_GIVE_UP_SECS)."""
    waits = backoff or store_backoff()
    started = time.monotonic()
    for delay in waits.delays():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        except OSError as error:
            if error.errno not in DISK_FULL_ERRNOS:
                raise
            if time.monotonic() - started + delay > waits.give_up_secs:
                raise
        time.sleep(delay)
