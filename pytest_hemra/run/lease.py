"""A runner's lease on a trial's job: renewed by a heartbeat while the trial runs.

A lease names its owner (`worker@host:pid`). A runner that dies stops renewing: its lease
expires and another runner reclaims the trial; on the same host a dead owner's process is seen
gone at once. A runner that finds its lease gone (it was cut off from the store past its
expiry, and another runner took the trial over) stops the trial: only the new row's result
counts (`store.finish_trial` leaves a replaced row alone). The heartbeat is also how a running
trial hears `hemra cancel`. A beat the store
cannot take for now (its disk full, its lock held) is skipped: the lease outlasts a few.

One thread a process beats for every trial it runs (`Beats`), all of them in one write: a
process running hundreds of trials at once (`run/lanes.py`) costs the store one write a beat,
not hundreds.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from pytest_hemra.core.errors import HemraError, StoreUnavailable
from pytest_hemra.core.lifecycle import JobState
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive, owner_name

__all__ = ["HEARTBEAT_SECS", "LEASE_SECS", "Heartbeat", "is_alive", "owner_name"]

LEASE_SECS = float(os.environ.get("HEMRA_LEASE_SECS", "30"))
HEARTBEAT_SECS = 1.0  # also how soon a running trial hears `hemra cancel`
# a lease this runner held is no longer its own: it could not renew it in time (cut off from
# the store) and another runner took the trial over; the trial stops here, its result not kept
LEASE_LOST = "its runner lost its lease: another runner took the trial over"


class Heartbeat:
    """One trial's lease, renewed while it runs (`with`); calls `on_cancel` once if its job is
    cancelled."""

    def __init__(
        self, store_path: str | Path, trial: str, owner: str, on_cancel: Callable[[], None]
    ) -> None:
        self.store_path = store_path
        self.trial = trial
        self.owner = owner
        self.on_cancel = on_cancel
        self.cancelled = threading.Event()
        self.reason = "cancelled by hemra cancel"  # what stopped the trial, once cancelled

    def __enter__(self) -> Heartbeat:
        Beats.of(str(self.store_path), self.owner).add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        Beats.of(str(self.store_path), self.owner).remove(self)

    def stop(self, reason: str) -> None:
        """Stop the trial from this process (its session stopping): as a cancel would."""
        self._cancel(reason)

    def _cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.reason = reason
            self.cancelled.set()
            with contextlib.suppress(HemraError):  # its engine down: reaped when back
                self.on_cancel()


class Beats:
    """The one thread that beats a process's leases on one store, as one owner: started with
    its first lease, ended with its last."""

    _all: ClassVar[dict[tuple[str, str], Beats]] = {}
    _made: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, address: str, owner: str) -> None:
        self.address = address
        self.owner = owner
        self.leases: dict[str, Heartbeat] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    @classmethod
    def of(cls, address: str, owner: str) -> Beats:
        with cls._made:
            return cls._all.setdefault((address, owner), cls(address, owner))

    def add(self, lease: Heartbeat) -> None:
        with self.lock:
            self.leases[lease.trial] = lease
            if self.thread is None:
                self.thread = threading.Thread(target=self._beat, name="hemra-leases", daemon=True)
                self.thread.start()

    def remove(self, lease: Heartbeat) -> None:
        with self.lock:
            self.leases.pop(lease.trial, None)

    def _beat(self) -> None:
        store: Store | None = None  # a connection of its own (a path or a URL), once it opens
        try:
            while True:
                time.sleep(HEARTBEAT_SECS)
                with self.lock:
                    leases = dict(self.leases)
                    if not leases:
                        self.thread = None  # the next lease starts another
                        return
                try:
                    store = store or Store(self.address)
                    states = store.heartbeats(list(leases), self.owner, LEASE_SECS)
                except StoreUnavailable:
                    continue  # its disk full, its lock held, its server away: beat again later
                for trial, state in states.items():
                    if state == JobState.CANCELLING:
                        leases[trial]._cancel("cancelled by hemra cancel")
                    elif state is None and trial in self.leases:
                        leases[trial]._cancel(LEASE_LOST)
        finally:
            if store is not None:
                store.close()
