"""PID 1 of a sandbox whose image has no ENTRYPOINT: what keeps it alive and reaps.

Where it can, HEMRA runs a PID 1 no process in the sandbox may trace or read: the image's own
perl (Essential in Debian and Ubuntu, so in nearly every task image built on them) made
non-dumpable with prctl(PR_SET_DUMPABLE, 0) before it loops reaping orphans. The sandbox's root
holds no CAP_SYS_PTRACE, so its ptrace, /proc/1/mem, /proc/1/environ and process_vm_writev on a
non-dumpable PID 1 are refused, whatever user it becomes; and signals from inside the sandbox to
a PID 1 without handlers are dropped by the kernel (it handles SIGCHLD alone, to reap at once).
Such a PID 1 outlives the agent's turn untouched, so a root agent's processes can be killed from
this host (`processes.end_all_but_init`) instead of the sandbox being killed whole and started
again (a start, the engine's costliest request under load). Elsewhere (no perl in the image, an
engine whose storage or cgroups are not on this host, an architecture whose prctl number is not
known here) docker-init is PID 1, as before, and the sandbox is emptied by a restart."""

from __future__ import annotations

from typing import Any

from pytest_hemra.execute.sandbox.overlay import image_has_file

PERL = "usr/bin/perl"  # in the image, as the overlay layers hold it
# prctl's syscall number by Docker's name for the architecture (asm-generic's for arm64)
PRCTL = {"amd64": 157, "arm64": 167}
NAME = "hemra-init"  # what the sandbox's `ps` shows for PID 1


def program(architecture: str) -> list[str] | None:
    """PID 1's argv for an image of `architecture`, or None where its prctl is not known."""
    number = PRCTL.get(architecture)
    if number is None:
        return None
    loop = (  # SIGCHLD (an orphan exited) cuts its sleep short: zombies are reaped at once
        f'syscall({number}, 4, 0) == 0 or die "prctl: $!"; $0 = "{NAME}";'
        " $SIG{CHLD} = sub {}; for (;;) { sleep 1 if wait() == -1 }"
    )
    return ["/" + PERL, "-e", loop]


def keeper_for(image: dict[str, Any]) -> list[str] | None:
    """The guarded PID 1 for `image` (its inspect answer): without an ENTRYPOINT, with perl in
    its layers on this host; else None."""
    if image["Config"].get("Entrypoint") or not image_has_file(image, PERL):
        return None
    return program(str(image.get("Architecture") or ""))
