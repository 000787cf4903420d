"""A sandbox's processes seen and ended from outside it: every process of a user killed by the
kernel and seen gone in the engine's own listing (numbers, never names), and the ports something
in it listens on, read from its network namespace on the engine's host."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pytest_hemra.execute.sandbox import KILL_ALL
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS

END_USER_SECS = 5.0  # a user's processes killed and seen gone, else the sandbox emptied whole
# 127.0.0.11 as /proc/net/tcp writes it: Docker's embedded DNS listens there in every
# container of a user-defined network, on a port of its own
ENGINE_DNS = "0B00007F"


# where an engine's cgroups hold a container's processes on its host: cgroup v2 or v1 (its
# pids, unified or systemd hierarchy), under the cgroupfs or the systemd driver
CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified")
CGROUP_GROUPS = ("docker/{id}", "system.slice/docker-{id}.scope")


def init_pid(container_id: str) -> int | None:
    """The PID (this machine's) of the container's PID 1, read from its cgroup on this host
    (no request to its engine): the process there that is 1 in its own PID namespace. None
    where it cannot be found here (an engine elsewhere, another driver's layout)."""
    for root in CGROUP_ROOTS:
        for group in CGROUP_GROUPS:
            try:
                listed = Path(root, group.format(id=container_id), "cgroup.procs").read_text()
            except OSError:
                continue
            for pid in listed.split():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                for line in status.splitlines():
                    if line.startswith("NSpid:") and line.split()[-1] == "1":
                        return int(pid)
    return None


def _tcp_in_use(pid: int) -> bool:
    """Whether the network namespace of `pid` holds any TCP socket (its sockstat counts), or
    that cannot be read (then the tables are)."""
    try:
        for name, key in (("sockstat", "TCP:"), ("sockstat6", "TCP6:")):
            for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines():
                fields = line.split()
                if fields[:1] == [key] and fields[1:2] == ["inuse"] and fields[2] != "0":
                    return True
    except (OSError, IndexError):
        return True
    return False


class ProcessSweep:
    """What `DockerSandbox` does to the processes in its container, from outside it."""

    container: Any
    _pid: int | None  # PID 1's on the engine's host, as long as it runs (`halt` forgets it)

    def _kill_processes(self, user: str) -> None:
        """Kill every process of `user` but PID 1: the exec's whole tree, whatever it spawned."""
        self.container.exec_run(list(KILL_ALL), user=user)

    def end_user(self, user: str) -> bool:
        """Every process of `user` ("uid:gid") gone: `kill -9 -1` run as that user (the kernel
        picks the processes it may signal, whatever their names or thread states), until the
        engine's own listing (the container's cgroup, read on the engine's host: numbers only)
        shows none of its uid's. False when that cannot be done by `END_USER_SECS` (a command cannot
        start: the pids limit is full; the image's shell no longer kills): the caller empties
        the sandbox whole instead."""
        uid = user.split(":")[0]
        deadline = time.monotonic() + END_USER_SECS
        while True:
            try:
                listed = self.container.top(ps_args="-o pid,uid")["Processes"] or []
            except DOCKER_ERRORS:
                return False
            if not any(len(row) > 1 and row[1].strip() == uid for row in listed):
                return True
            if time.monotonic() >= deadline:
                return False
            try:
                self.container.exec_run(list(KILL_ALL), user=user)
            except DOCKER_ERRORS:
                return False

    def listening_ports(self) -> frozenset[int] | None:
        """Read from /proc/<PID 1>/net/tcp{,6} on the engine's host (a local engine, a runner
        that may read it): the sockets in LISTEN state (0A), by port."""
        if self._pid is None:  # PID 1's, as long as it runs (`halt` forgets it)
            self._pid = init_pid(self.container.id)
        if self._pid is None:  # not found on this host: asked of the engine
            try:
                self.container.reload()
                self._pid = int(self.container.attrs["State"]["Pid"] or 0)
            except DOCKER_ERRORS:
                return None
        pid = self._pid
        try:  # the engine's PID is this machine's (not a runner in a namespace of its own)
            if pid <= 0 or self.container.id not in Path(f"/proc/{pid}/cgroup").read_text():
                return None
        except OSError:
            return None
        if not _tcp_in_use(pid):  # no TCP socket at all (0.1 ms; the tables take ~10 ms)
            return frozenset()
        ports: set[int] = set()
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                return None
            for line in lines:
                fields = line.split()
                if len(fields) > 3 and fields[3] == "0A" and ":" in fields[1]:
                    address, port = fields[1].rsplit(":", 1)
                    if address != ENGINE_DNS:  # the engine's own resolver, not the agent's
                        ports.add(int(port, 16))
        return frozenset(ports)
