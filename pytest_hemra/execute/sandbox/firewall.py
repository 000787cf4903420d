"""The host firewall around HEMRA's sandbox networks: what a sandbox's packets may reach on the
runner's machine. Rules live in the tables dockerd itself uses (iptables, `-w` for its lock).

Each HEMRA bridge gets a chain `HEMRA-<bridge>` jumped to from INPUT: packets from the bridge to
any of the host's addresses are rejected, except TCP to a gateway's address and port (`admit`).
Packets from the bridge to link-local addresses (169.254.0.0/16: cloud metadata services) are
rejected in DOCKER-USER, before anything forwards them, and IPv6 from the bridge is dropped whole.
Rejected, not dropped: a connection the sandbox may not make fails at once instead of hanging.
Inter-container traffic on the bridge is dropped by dockerd itself (`enable_icc=false`). `reap`
removes the rules of bridges that no longer exist.

An admitted port belongs to the process that admitted it: its rule carries the owner's pid and
start time as a comment, so a process taking back its port never removes the rule of another that
has since been given the same port by the kernel, and `reap_admitted` removes only the rules of
owners that are gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pytest_hemra.core.errors import InfraError

LINK_LOCAL = "169.254.0.0/16"
CHAIN_PREFIX = "HEMRA-"
OWNER_PREFIX = "hemra-owner:"
COMMAND_TIMEOUT_SECS = 30.0


def chain_of(bridge: str) -> str:
    return CHAIN_PREFIX + bridge


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which(tool)
    if path is None:
        raise InfraError(f"sandbox firewall: {tool} is not installed (HEMRA's networks need it)")
    try:
        return subprocess.run(
            [path, "-w", "10", *args],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InfraError(f"sandbox firewall: {tool} {' '.join(args)} failed ({error})") from error


def _must(tool: str, *args: str) -> None:
    done = _run(tool, *args)
    if done.returncode != 0:
        raise InfraError(
            f"sandbox firewall: {tool} {' '.join(args)} failed: {done.stderr.strip()}"
            " (HEMRA's sandbox networks need root's iptables on the runner's machine)"
        )


def check() -> None:
    """Raise InfraError unless this process can read and change the host's iptables rules."""
    _must("iptables", "-S", "INPUT")


def _has(tool: str, chain: str, *rule: str) -> bool:
    return _run(tool, "-C", chain, *rule).returncode == 0


def _ensure(tool: str, chain: str, *rule: str, first: bool = True) -> None:
    if not _has(tool, chain, *rule):
        _must(tool, "-I" if first else "-A", chain, *rule)


def _delete(tool: str, chain: str, *rule: str) -> None:
    while _has(tool, chain, *rule):
        if _run(tool, "-D", chain, *rule).returncode != 0:
            return


def _forward_chain() -> str:
    """DOCKER-USER (dockerd's chain for user rules, ahead of its own), else FORWARD."""
    return "DOCKER-USER" if _run("iptables", "-S", "DOCKER-USER").returncode == 0 else "FORWARD"


def _no_way_out(bridge: str) -> tuple[str, ...]:
    """A rule refusing what leaves `bridge` for anywhere else as an unreachable network: what
    Docker's internal network drops (a connection then hangs until its timeout) fails at once,
    as it does with the network cut ("Network is unreachable")."""
    rejected = ("-j", "REJECT", "--reject-with", "icmp-net-unreachable")
    return ("-i", bridge, "!", "-o", bridge, *rejected)


def guard(bridge: str, *, internal: bool = False) -> None:
    """Reject everything from `bridge` to the host and to link-local addresses, and for an
    `internal` network (no route out) to anywhere off it (idempotent)."""
    chain = chain_of(bridge)
    if _run("iptables", "-S", chain).returncode != 0:
        created = _run("iptables", "-N", chain)
        if created.returncode != 0 and "exists" not in created.stderr:
            _must("iptables", "-N", chain)
    _ensure("iptables", chain, "-j", "REJECT", first=False)
    _ensure("iptables", "INPUT", "-i", bridge, "-j", chain)
    _ensure("iptables", _forward_chain(), "-i", bridge, "-d", LINK_LOCAL, "-j", "REJECT")
    if internal:
        _ensure("iptables", _forward_chain(), *_no_way_out(bridge))
    if shutil.which("ip6tables") is not None:
        for base in ("INPUT", "FORWARD"):
            _ensure("ip6tables", base, "-i", bridge, "-j", "DROP")


@dataclass(frozen=True)
class Admission:
    """One `admit` rule: TCP to host:port let in, for the process `owner` names ("" when the
    rule predates owners)."""

    host: str
    port: int
    owner: str


@cache
def this_process() -> str:
    """This process's owner token: its pid and the kernel's start time for it (so a pid reused
    by a later process is not taken for this one)."""
    return _owner_of(os.getpid()) or str(os.getpid())


def _owner_of(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid}.{stat.rpartition(')')[2].split()[19]}"  # field 22, after the command name


def owner_alive(owner: str) -> bool:
    """Whether the process an owner token names still runs (the same process, not its pid's
    next holder)."""
    pid, _, _ = owner.partition(".")
    return pid.isdigit() and _owner_of(int(pid)) == owner


def admit(bridge: str, host: str, port: int, owner: str | None = None) -> None:
    """Let the bridge's sandboxes reach TCP `host:port` (a gateway) on the host, for `owner`
    (this process unless named)."""
    _ensure("iptables", chain_of(bridge), *_gateway_rule(host, port, owner or this_process()))


def revoke(bridge: str, host: str, port: int, owner: str | None = None) -> None:
    """Take back `owner`'s `admit` (this process's unless named); another owner's rule for the
    same port stays."""
    if _run("iptables", "-S", chain_of(bridge)).returncode == 0:
        _delete("iptables", chain_of(bridge), *_gateway_rule(host, port, owner or this_process()))


def admitted(bridge: str) -> list[Admission]:
    """The rules `admit` made on `bridge`."""
    listed = _run("iptables", "-S", chain_of(bridge))
    found = []
    for line in listed.stdout.splitlines() if listed.returncode == 0 else []:
        parts = line.split()
        if "ACCEPT" in parts and "-d" in parts and "--dport" in parts:
            host = parts[parts.index("-d") + 1].removesuffix("/32")
            port = int(parts[parts.index("--dport") + 1])
            comment = parts[parts.index("--comment") + 1] if "--comment" in parts else ""
            found.append(Admission(host, port, comment.strip('"').removeprefix(OWNER_PREFIX)))
    return found


def stale_admissions(bridge: str, listening: Callable[[str, int], bool]) -> list[Admission]:
    """The admissions on `bridge` whose owner is gone and whose port nothing listens on (a
    runner killed before it took its port back)."""
    return [
        rule
        for rule in admitted(bridge)
        if not (rule.owner and owner_alive(rule.owner)) and not listening(rule.host, rule.port)
    ]


def reap_admitted(bridge: str, listening: Callable[[str, int], bool]) -> None:
    """Remove `stale_admissions`."""
    for rule in stale_admissions(bridge, listening):
        remove_admission(bridge, rule)


def remove_admission(bridge: str, rule: Admission) -> None:
    if rule.owner:
        revoke(bridge, rule.host, rule.port, rule.owner)
    else:
        _delete("iptables", chain_of(bridge), *_unowned_rule(rule.host, rule.port))


def _gateway_rule(host: str, port: int, owner: str) -> tuple[str, ...]:
    comment = ("-m", "comment", "--comment", OWNER_PREFIX + owner)
    return ("-p", "tcp", "-d", host, "--dport", str(port), *comment, "-j", "ACCEPT")


def _unowned_rule(host: str, port: int) -> tuple[str, ...]:
    """An admission as HEMRA wrote it before rules had owners."""
    return ("-p", "tcp", "-d", host, "--dport", str(port), "-j", "ACCEPT")


def unguard(bridge: str) -> None:
    """Every rule `guard` and `admit` made for `bridge`, removed."""
    chain = chain_of(bridge)
    _delete("iptables", "INPUT", "-i", bridge, "-j", chain)
    _delete("iptables", _forward_chain(), "-i", bridge, "-d", LINK_LOCAL, "-j", "REJECT")
    _delete("iptables", _forward_chain(), *_no_way_out(bridge))
    if _run("iptables", "-S", chain).returncode == 0:
        _run("iptables", "-F", chain)
        _run("iptables", "-X", chain)
    if shutil.which("ip6tables") is not None:
        for base in ("INPUT", "FORWARD"):
            _delete("ip6tables", base, "-i", bridge, "-j", "DROP")


def stale_bridges() -> list[str]:
    """The bridges HEMRA has chains for that no longer exist (a network removed by hand, or
    by a runner killed before it took its rules back)."""
    listed = _run("iptables", "-S")
    if listed.returncode != 0:
        return []
    found = []
    for line in listed.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "-N" and parts[1].startswith(CHAIN_PREFIX):
            bridge = parts[1].removeprefix(CHAIN_PREFIX)
            if not Path("/sys/class/net", bridge).exists():
                found.append(bridge)
    return found


def reap() -> None:
    """Remove the rules of HEMRA bridges that are gone (a network removed by hand, say)."""
    for bridge in stale_bridges():
        unguard(bridge)


def stuck_chains() -> dict[str, str]:
    """HEMRA's chains of bridges that are gone, still there after `reap` (a rule HEMRA did not
    make jumps to one, so iptables refuses to delete it), each with what to do."""
    return {
        chain_of(bridge): (
            f"iptables refuses to delete it: a rule HEMRA did not make still jumps to it"
            f" (`iptables -S | grep -- '-j {chain_of(bridge)}'` shows it); delete that rule,"
            " then `hemra clean`"
        )
        for bridge in stale_bridges()
    }
