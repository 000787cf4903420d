"""A runner's lease on a trial's job: renewed by a heartbeat while the trial runs.

A lease names its owner (`worker@host:pid`). A runner that dies stops renewing: its lease
expires and another runner reclaims the trial; on the same host a dead owner's process is seen
gone at once. The heartbeat is also how a running trial hears `hemra cancel`. A beat the store
cannot take for now (its disk full, its lock held) is skipped: the lease outlasts a few.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from pytest_hemra.core.errors import HemraError, StoreUnavailable
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive, owner_name

__all__ = ["HEARTBEAT_SECS", "LEASE_SECS", "Heartbeat", "is_alive", "owner_name"]

LEASE_SECS = float(os.environ.get("HEMRA_LEASE_SECS", "30"))
HEARTBEAT_SECS = 1.0  # also how soon a running trial hears `hemra cancel`


class Heartbeat:
    """Renews one trial's lease in a thread; calls `on_cancel` once if the job is cancelled."""

    def __init__(
        self, store_path: str | Path, trial: str, owner: str, on_cancel: Callable[[], None]
    ) -> None:
        self.store_path = store_path
        self.trial = trial
        self.owner = owner
        self.on_cancel = on_cancel
        self.cancelled = threading.Event()
        self.reason = "cancelled by hemra cancel"  # what stopped the trial, once cancelled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"hemra-lease-{trial}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def stop(self, reason: str) -> None:
        """Stop the trial from this process (its session stopping): as a cancel would."""
        if not self.cancelled.is_set():
            self.reason = reason
            self.cancelled.set()
            with contextlib.suppress(HemraError):
                self.on_cancel()

    def _beat(self) -> None:
        store = Store(self.store_path)  # a connection of its own: a path or a URL
        try:
            while not self._stop.wait(HEARTBEAT_SECS):
                try:
                    state = store.heartbeat(self.trial, self.owner, LEASE_SECS)
                except StoreUnavailable:
                    continue  # its disk full, or locked by another process: beat again later
                if state == "cancelling" and not self.cancelled.is_set():
                    self.cancelled.set()
                    with contextlib.suppress(HemraError):  # its engine down: reaped when back
                        self.on_cancel()
        finally:
            store.close()
