"""An exclusive (or shared) lock on a file, held across processes and threads, waited for up to
a deadline: each call opens the file anew, so the threads of one process exclude each other as
other processes do."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pytest_hemra.core.errors import InfraError


@contextmanager
def file_lock(
    path: Path, timeout: float, waited: str, *, shared: bool = False, poll: float = 0.1
) -> Iterator[None]:
    """Hold `path`'s lock, polled every `poll` seconds; not had within `timeout`, InfraError
    with `waited` (what the caller was waiting for, said in full)."""
    deadline = time.monotonic() + timeout
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise InfraError(waited) from None
                time.sleep(poll)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
