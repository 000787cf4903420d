"""A job's owner, as leases name it (`worker@host:pid`), and whether it may still be running."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def owner_name() -> str:
    """This process as a lease owner: the xdist worker (or `main`), host and pid."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return f"{worker}@{socket.gethostname()}:{os.getpid()}"


def is_alive(owner: str | None) -> bool:
    """Whether a lease owner may still be running: its process exists, if it is on this host."""
    if not owner or "@" not in owner or ":" not in owner:
        return False
    host, _, pid = owner.rpartition("@")[2].rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine: only the lease's expiry tells
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    state = stat.rpartition(")")[2].split()[0]
    return state not in ("Z", "X")  # a zombie is dead: its parent just has not reaped it yet
