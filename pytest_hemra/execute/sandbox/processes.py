"""What runs in a sandbox before the agent's turn, and the sweep that leaves only that after it.

The sandbox's root holds no CAP_KILL, so it can signal only its own processes:
each owner's new processes are killed by a command run as that owner. Processes are told apart by
PID and start time (a reused PID is a new process), read from /proc with shell builtins alone (no
`ps`, no child processes of the sweep to mistake for the agent's). Each sweep stops every new
process of its owner before killing them, so a process that forks in a loop cannot outrun it.
A killed process whose parent is gone stays a zombie (PID 1 is `sleep`, which reaps nothing):
zombies run nothing and are not counted. PID 1 (the container's init) is never listed: nothing
inside may signal it, and right after the container starts it can still be runc's init, whose
/proc entries are not readable, so a listing may or may not see it.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import ROOT_USER, Sandbox

SWEEP_SECS = 15.0  # a killed process can take a while to go on a loaded machine (D state)
SWEEP_PAUSES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)  # between rounds, then the last one again
COMMAND_TIMEOUT_SECS = 30.0

# one line a live process not among the `pid:starttime` arguments: pid uid gid starttime state
# comm (the listing shell left out); when there is none, the script in $HEMRA_THEN runs (as root)
_LIST = r"""
keep=" $* "
found=
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = "$$" ] || [ "$p" = 1 ] && continue
  read -r l 2>/dev/null < "$d/stat" || continue
  u=; g=
  while read -r k a b; do
    case $k in Uid:) u=$a ;; Gid:) g=$a; break ;; esac
  done 2>/dev/null < "$d/status"
  c=${l#*\(}; c=${c%\)*}
  set -- ${l##*\) }
  case $1 in Z|X|x) continue ;; esac
  case $keep in *" $p:${20} "*) continue ;; esac
  echo "$p $u $g ${20} $1 $c"
  found=1
done
[ -n "$found" ] || [ -z "$HEMRA_THEN" ] || eval "$HEMRA_THEN"
"""

# run as one owner, $1 its uid, the rest `pid:starttime` to keep: stop every other live process
# of that owner, then kill them, until none is left
_KILL = r"""
me=$1; shift; keep=" $* "
round=0
while :; do
  found=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] || [ "$p" = 1 ] && continue
    read -r l 2>/dev/null < "$d/stat" || continue
    u=
    while read -r k a b; do
      case $k in Uid:) u=$a; break ;; esac
    done 2>/dev/null < "$d/status"
    [ "$u" = "$me" ] || continue
    set -- ${l##*\) }
    case $1 in Z|X|x) continue ;; esac
    case $keep in *" $p:${20} "*) continue ;; esac
    kill -STOP "$p" 2>/dev/null
    found="$found $p"
  done
  [ -z "$found" ] && exit 0
  kill -KILL $found 2>/dev/null
  round=$((round + 1))
  [ "$round" -ge 50 ] && exit 3
done
"""


@dataclass(frozen=True)
class Process:
    pid: int
    uid: int
    gid: int
    started: int  # clock ticks after boot: with the PID, one process for its whole life
    state: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.pid}:{self.started}"

    @property
    def is_live(self) -> bool:
        return self.state not in ("Z", "X", "x")


@dataclass(frozen=True)
class Baseline:
    """The processes a sandbox ran before the agent's turn: PID 1 and the task's own services."""

    keys: frozenset[str]


@dataclass(frozen=True)
class Swept:
    """What a sweep killed, and the lines its `then` script printed."""

    killed: list[Process]
    said: list[str]


def running(sandbox: Sandbox, keep: frozenset[str] = frozenset()) -> list[Process]:
    """Every live process in the sandbox but those in `keep`, read as root from /proc (readable
    by all there)."""
    return _listing(sandbox, keep, "")[0]


def _listing(sandbox: Sandbox, keep: frozenset[str], then: str) -> tuple[list[Process], list[str]]:
    """`running`'s processes; when there are none, `then` (a shell script) runs as root in the
    same command, a failure of it raised, and the lines it printed starting with `+` are
    returned too (without the `+`)."""
    with tempfile.TemporaryDirectory(prefix="hemra-ps-") as scratch:
        out, err = Path(scratch) / "out", Path(scratch) / "err"
        result = sandbox.exec(
            ["/bin/sh", "-c", _LIST, "list", *sorted(keep)],
            user=ROOT_USER,
            env={"HEMRA_THEN": then} if then else {},
            timeout=COMMAND_TIMEOUT_SECS,
            stdout=out,
            stderr=err,
            workdir="/",
        )
        if result.timed_out or result.exit_code != 0:
            detail = err.read_text(errors="replace").strip()[-300:]
            raise InfraError(f"sandbox: listing its processes failed ({detail})")
        lines = out.read_text(errors="replace").splitlines()
        said = [line[1:] for line in lines if line.startswith("+")]
        return [p for line in lines if (p := _parse(line))], said


INIT_ONLY = Baseline(frozenset())  # PID 1 alone, which is never listed


def record_baseline(sandbox: Sandbox) -> Baseline:
    """What runs in the sandbox now, listed."""
    return Baseline(frozenset(p.key for p in running(sandbox)))


def baseline_of(sandbox: Sandbox) -> Baseline:
    """What runs before the agent's turn, to be kept by its sweep: listed in a sandbox that may
    run the task's own services; PID 1 alone, without a listing, in one that runs nothing HEMRA
    did not start (a docker sandbox: HEMRA starts nothing that outlives its command before the
    turn, and what a previous step or verifier left is swept with the agent's)."""
    return record_baseline(sandbox) if sandbox.runs_services else INIT_ONLY


def sweep(
    sandbox: Sandbox, baseline: Baseline, report: Path | None = None, then: str = ""
) -> Swept:
    """Kill every live process not in `baseline`, whoever runs it, and make sure they are gone;
    then run `then` as root (in the command that found nothing left: one command in the common
    case). Returns those killed, noted in `report` when there were any, and what `then`
    printed. Raises InfraError if
    some still run after `SWEEP_SECS` of rounds (a killed process stuck in the kernel under
    load can take a moment to go: the rounds pause a little longer each time)."""
    killed: dict[str, Process] = {}
    deadline = time.monotonic() + SWEEP_SECS
    for round_ in itertools.count():
        time.sleep(SWEEP_PAUSES[min(round_, len(SWEEP_PAUSES) - 1)])
        left, said = _listing(sandbox, baseline.keys, then)
        if not left:
            if report is not None and killed:
                report.write_text(
                    "".join(f"{p.pid} uid={p.uid} {p.name}\n" for p in killed.values()),
                    encoding="utf-8",
                )
            return Swept(list(killed.values()), said)
        killed |= {p.key: p for p in left}
        for uid, gid in sorted({(p.uid, p.gid) for p in left}):
            with tempfile.TemporaryDirectory(prefix="hemra-kill-") as scratch:
                sandbox.exec(
                    ["/bin/sh", "-c", _KILL, "sweep", str(uid), *sorted(baseline.keys)],
                    user=f"{uid}:{gid}",
                    env={},
                    timeout=COMMAND_TIMEOUT_SECS,
                    stdout=Path(scratch) / "out",
                    stderr=Path(scratch) / "err",
                    workdir="/",
                )
        if time.monotonic() >= deadline:
            names = ", ".join(f"{p.pid} ({p.name}, uid {p.uid})" for p in left)
            raise InfraError(
                f"sandbox: processes the agent left still run after {SWEEP_SECS:g}s of"
                f" sweeping: {names}"
            )
    raise AssertionError("unreachable")


def _parse(line: str) -> Process | None:
    parts = line.split(" ", 5)
    if len(parts) < 5 or not all(part.isdigit() for part in parts[:4]):
        return None
    pid, uid, gid, started = (int(part) for part in parts[:4])
    return Process(pid, uid, gid, started, parts[4], parts[5] if len(parts) > 5 else "")
