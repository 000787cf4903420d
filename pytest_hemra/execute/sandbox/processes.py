"""A sandbox's processes seen and ended from outside it: every process of a user killed by the
kernel and seen gone in the engine's own listing (numbers, never names), and the ports something
in it listens on, read from its network namespace on the engine's host."""

from __future__ import annotations

import contextlib
import os
import signal
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


# a container's freezer on this host: cgroup v2 (its folder's cgroup.freeze) or v1's freezer
# hierarchy, as (root, the file, what freezes it, what thaws it, what it reads once frozen)
FREEZERS = (
    ("/sys/fs/cgroup", "cgroup.freeze", "1", "0", None),
    ("/sys/fs/cgroup/freezer", "freezer.state", "FROZEN", "THAWED", "FROZEN"),
)


def end_all_but_init(container_id: str, init: int) -> str | None:
    """Every process of the container but its PID 1 (`init`, this machine's PID) killed from
    this host, none asked of the engine: its cgroup frozen (nothing forks meanwhile), SIGKILL
    to each process listed there but `init`, thawed, then seen gone (a killed process leaves
    the cgroup's listing as it exits) and reaped. None once done; else what could not be done
    here by `END_USER_SECS` (no freezer found, a process stuck in the kernel, PID 1 gone): the
    caller empties the sandbox whole."""
    deadline = time.monotonic() + END_USER_SECS
    for root, name, freeze, thaw, frozen in FREEZERS:
        control = _cgroup_file((root,), container_id, name)
        if control is not None:
            missed = _end_frozen(control, (freeze, thaw, frozen), init, deadline)
            return missed or _reaped(container_id, deadline)
    return "no freezer cgroup of the container on this host"


def _cgroup_file(roots: tuple[str, ...], container_id: str, name: str) -> Path | None:
    """The container's cgroup file `name` under the first of `roots` that has it, or None."""
    for root in roots:
        for group in CGROUP_GROUPS:
            path = Path(root, group.format(id=container_id), name)
            if path.is_file():
                return path
    return None


def _reaped(container_id: str, deadline: float) -> str | None:
    """None once the container's pids count is down to PID 1 by `deadline` (a killed process
    is a zombie, out of the cgroup's listing but still in its pids limit, until PID 1 reaps
    it), else what it still counts."""
    count = _cgroup_file(CGROUP_ROOTS, container_id, "pids.current")
    if count is None:
        return None  # no pids controller here: no limit for zombies to fill
    try:
        while (counted := int(count.read_text())) > 1:
            if time.monotonic() >= deadline:
                return f"{counted - 1} killed processes not reaped by PID 1 in {END_USER_SECS:g}s"
            time.sleep(0.005)
    except (OSError, ValueError) as error:
        return f"pids.current unreadable ({error})"
    return None


def _end_frozen(
    control: Path, states: tuple[str, str, str | None], init: int, deadline: float
) -> str | None:
    """The kill under a frozen cgroup (see `end_all_but_init`): None once every process but
    `init` has left the cgroup's listing, else which step ran out of time or failed."""
    freeze, thaw, frozen = states
    folder = control.parent
    listing = folder / "cgroup.procs"
    try:
        control.write_text(freeze)
        try:
            while not _is_frozen(folder, control, frozen):
                if time.monotonic() >= deadline:
                    return f"the cgroup not frozen in {END_USER_SECS:g}s"
                time.sleep(0.005)
            for pid in {int(n) for n in listing.read_text().split()} - {init}:
                with contextlib.suppress(ProcessLookupError):  # gone meanwhile
                    os.kill(pid, signal.SIGKILL)
        finally:
            control.write_text(thaw)
        while left := {int(n) for n in listing.read_text().split()} - {init}:
            if time.monotonic() >= deadline:
                return f"{len(left)} killed processes still listed after {END_USER_SECS:g}s"
            time.sleep(0.005)
        if str(init) not in listing.read_text().split():
            return "PID 1 gone"
    except OSError as error:
        return f"the cgroup unreadable ({error})"
    return None


def _is_frozen(folder: Path, control: Path, frozen: str | None) -> bool:
    """v1: the state file reads FROZEN; v2: cgroup.events says `frozen 1`."""
    if frozen is not None:
        return control.read_text().strip() == frozen
    return "frozen 1" in (folder / "cgroup.events").read_text().splitlines()


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
    _guarded_init: bool  # PID 1 is the keeper: no process in the sandbox may trace it
    _halted: bool
    missed: str | None = None  # why the last `end_all_but_init` fell back (None: it did not)

    def end_all_but_init(self) -> bool:
        """Every process but PID 1 killed from this host (`end_all_but_init`), where PID 1 is
        the keeper, which nothing in the sandbox could trace, write or signal: what any agent
        left, whoever it ran as, gone, and the sandbox running on. False elsewhere (docker-init
        as PID 1, an engine not on this host, its PID 1 gone): the caller empties it whole."""
        self.missed = None
        if not self._guarded_init or self._halted:
            return False
        if self._pid is None:
            self._pid = init_pid(self.container.id)
        if self._pid is None:
            self.missed = "PID 1 not found in the container's cgroup on this host"
            return False
        self.missed = end_all_but_init(self.container.id, self._pid)
        return self.missed is None

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
