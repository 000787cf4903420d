"""Engine pings: one on a kept connection against one on a new connection, on this machine's
engine (DOCKER_HOST, else the local socket).

A runner pings its engine every 0.5 s, each time on a new connection (`health.ping`: a daemon
told to stop answers on connections it has open until it exits). Printed per round: both
pings' wall and CPU time per call and their ratios, new against kept, measured in the same run.

    python benchmarks/engine_ping.py [--pings 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_hemra.execute.sandbox.health import ping, probe_client  # noqa: E402


def per_ping(pings: int, new: bool) -> tuple[float, float]:
    """Wall and CPU milliseconds per ping, on a new connection each time or on a kept one."""
    probe = probe_client()
    probe.ping()  # connected, for the kept case
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    for _ in range(pings):
        if new:
            assert ping(probe) is None
        else:
            probe.ping()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = (after.ru_utime + after.ru_stime) - (cpu.ru_utime + cpu.ru_stime)
    probe.close()
    return wall / pings * 1e3, used / pings * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.rounds):
        kept_wall, kept_cpu = per_ping(args.pings, new=False)
        new_wall, new_cpu = per_ping(args.pings, new=True)
        print(
            f"kept {kept_wall:.2f} ms ({kept_cpu:.2f} ms CPU)  new {new_wall:.2f} ms"
            f" ({new_cpu:.2f} ms CPU)  new/kept {new_wall / kept_wall:.2f}x wall,"
            f" {new_cpu / kept_cpu:.2f}x CPU"
        )


if __name__ == "__main__":
    main()
