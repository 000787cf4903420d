"""Locks held in a PostgreSQL store: the engine's locks (an image being built or copied, a run's
network being made or removed) when runners on several machines share one store, where a lock
file in one machine's $TMPDIR excludes only the runners of that machine.

A PostgreSQL advisory lock (exclusive, or shared with other shared holders), keyed by a hash of
the lock's name, held on a connection of its own for as long as the block runs: the server
releases it when that connection ends, so a runner that dies holds nothing. Polled with
`pg_try_advisory_lock*`, so a wait has the caller's deadline.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, func, select

from pytest_hemra.core.errors import InfraError

POLL_SECS = 0.1


def lock_key(name: str) -> int:
    """A name as the signed 64-bit key PostgreSQL's advisory locks take."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def advisory_lock(
    engine: Engine, name: str, timeout: float, waited: str, *, shared: bool = False
) -> Iterator[None]:
    """Hold the store's lock `name` (with other shared holders when `shared`); not had within
    `timeout`, InfraError saying what was `waited` for."""
    key = lock_key(name)
    take = func.pg_try_advisory_lock_shared if shared else func.pg_try_advisory_lock
    give = func.pg_advisory_unlock_shared if shared else func.pg_advisory_unlock
    deadline = time.monotonic() + timeout
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
        while not connection.execute(select(take(key))).scalar():
            if time.monotonic() > deadline:
                raise InfraError(waited)
            time.sleep(POLL_SECS)
        try:
            yield
        finally:
            connection.execute(select(give(key)))
