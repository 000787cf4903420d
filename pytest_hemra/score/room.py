"""The verifier's clean room: where it runs (the agent's sandbox, or a fresh one with the agent's
files copied in), its network, and the root scripts that empty the room and hand the tests over.
`verification.py` runs test.sh in it and reads the rewards."""

from __future__ import annotations

import io
import itertools
import tarfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path, PurePosixPath

from pytest_hemra.core.errors import HemraError, InfraError
from pytest_hemra.execute.context import TrialContext
from pytest_hemra.execute.gateway.egress import proxy_env
from pytest_hemra.execute.sandbox import ROOT_USER, Sandbox, SandboxRequest
from pytest_hemra.resolve.limits import task_limits
from pytest_hemra.resolve.taskconfig import TaskVerifier
from pytest_hemra.resolve.verifier_environment import verifier_task

TESTS_DIR = "/tests"
VERIFIER_LOGS = "/logs/verifier"
CLEAR_SECS = 30.0
MAX_ROOM_COPY_BYTES = 4 << 30  # the most of the agent's /app a separate room receives

# run as root once the agent's processes are gone (`run/turn.empty_room`): no /tests (a
# root agent could have planted one), and /logs/verifier a new empty folder of root's (an old
# one, whoever filled it, is moved aside whole, then removed as far as root may)
EMPTY_ROOM = f"""set -e
rm -rf {TESTS_DIR}
[ ! -e {TESTS_DIR} ] && [ ! -L {TESTS_DIR} ]
old=/logs/.verifier-old-$$
if [ -e {VERIFIER_LOGS} ] || [ -L {VERIFIER_LOGS} ]; then mv {VERIFIER_LOGS} "$old"; fi
mkdir -m 0755 {VERIFIER_LOGS}
rm -rf "$old" 2>/dev/null || true
"""


# test.sh's own command: the tests, put in a folder of a name no one knows, moved to /tests
# (where the agent may have left one) and /logs/verifier made new, then test.sh; one command,
# where clearing the room first was a round trip of its own (~50 ms a trial)
STAGED_TESTS = f"""{EMPTY_ROOM}
mv "$1{TESTS_DIR}" {TESTS_DIR}
rmdir "$1"
"""
ENTER_TESTS = f"""{STAGED_TESTS}
set +e
exec bash {TESTS_DIR}/test.sh
"""
# a verifier that is not root: the room made as above, the tests and /logs/verifier its own
HAND_OVER = f"""{STAGED_TESTS}
chown -R "$2" {TESTS_DIR} {VERIFIER_LOGS}
"""


def verifier_network(context: TrialContext, settings: TaskVerifier) -> str:
    """The verifier's network: the task's (or step's) `[verifier] network_mode` when it sets
    one ("no-network": none, "public": the sandbox's, "allowlist": its hosts through the egress
    proxy), else the run's `[verifier] network`."""
    if settings.network_mode == "no-network":
        return "none"
    if settings.network_mode == "allowlist":
        return "none" if context.gateway is None else "allowlist"
    if settings.network_mode == "public":
        return "bridge"
    return context.spec.verifier.network


def end_around_keeper(context: TrialContext, sandbox: Sandbox, when: str) -> bool:
    """Every process in the sandbox but PID 1 killed from this host where PID 1 is HEMRA's
    keeper (`Sandbox.end_all_but_init`): whether that was done. Where the keeper's kill fell
    back, why is kept in the trial's `sandbox.txt` (`when` names the moment); the caller then
    empties the sandbox another way (as the agent's user, or killed whole)."""
    if sandbox.end_all_but_init():
        return True
    if sandbox.missed is not None:
        with (context.trial_dir / "sandbox.txt").open("a") as notes:
            notes.write(f"{when}: the kill from the host did not end: {sandbox.missed}\n")
    return False


def cut_network(context: TrialContext, sandbox: Sandbox, settings: TaskVerifier) -> bool:
    """The verifier's network set (`verifier_network`): cut, kept, or, for its own allowlist,
    only `hemra-gateway` (no route out but the egress proxy). True for an allowlist the proxy
    serves; a sandbox without HEMRA's network (a pool's engine) has its network cut instead,
    the stricter reading (none of the hosts rather than more)."""
    network = verifier_network(context, settings)
    if network == "allowlist" and sandbox.only_gateway_network():
        return True
    if network != "bridge":
        sandbox.disconnect_network()
    return False


@contextmanager
def verifier_egress(
    context: TrialContext, settings: TaskVerifier, folder: Path, proxied: bool
) -> Iterator[dict[str, str]]:
    """A verifier with its own allowlist: the proxy's variables for test.sh, its pass ended
    after it (what it reached and was refused kept in `folder/egress.json`); else nothing."""
    gateway = context.gateway
    if gateway is None or not proxied:
        yield {}
        return
    grant = gateway.egress.open(context.trial_id, tuple(settings.allowed_hosts or ()))
    try:
        yield proxy_env(gateway.egress.proxy_url(grant, context.gateway_host), context.direct_hosts)
    finally:
        gateway.egress.close(grant)
        grant.write(folder / "egress.json")


def is_separate(context: TrialContext) -> bool:
    """Whether the verifier gets a fresh sandbox: the run's setting or the task's, the stricter."""
    modes = {context.spec.verifier.environment_mode, context.task.config.verifier.environment_mode}
    modes |= {step.verifier.environment_mode for step in context.task.config.steps}
    return "separate" in modes


@contextmanager
def verifier_room(
    context: TrialContext, sandbox: Sandbox, request: SandboxRequest
) -> Iterator[Sandbox]:
    """Where the verifier runs. Shared (Harbor's default): the agent's sandbox as the agent
    left it, once emptied. Separate: a fresh sandbox from the same image with only the
    agent's /app copied in, so nothing the agent changed elsewhere (a replaced `python3`, a
    planted `.pth`, a process) reaches the verifier; closed when the context exits."""
    if not is_separate(context):
        yield sandbox
        return
    own = verifier_task(context.task)
    if own is not None:  # its [verifier.environment]: its image (built at resolve), its limits
        limits = task_limits(context.spec.sandbox, own)
        request = replace(
            request,
            image=context.provider.prepare(own, context.spec.sandbox.image),
            limits=replace(
                request.limits, cpus=limits.cpus, memory_mb=limits.memory_mb, pids=limits.pids
            ),
        )
    room_request = replace(
        request,
        network=request.network
        and (
            verifier_network(context, context.task.config.verifier) != "none"
            or context.spec.verifier.model_access  # the gateway's network, for its model
        ),
        name=f"{request.name}-verifier" if request.name else None,
        labels={**request.labels, "hemra.verifier": "separate"},
        mounts=(),
        files={},  # nothing of the agent's phase: the instruction, the oracle's solution
        folders={},
    )
    with context.provider.open(room_request) as room:
        copy_into(context, sandbox, room)
        yield room


def copy_into(context: TrialContext, sandbox: Sandbox, room: Sandbox) -> None:
    """The agent's /app, then /logs/artifacts and the task's declared `artifacts`, each at its
    own path, owners and modes kept; MAX_ROOM_COPY_BYTES in all (past it, what arrived)."""
    budget = MAX_ROOM_COPY_BYTES
    paths = [context.workdir, "/logs/artifacts", *context.task.config.artifact_paths]
    declared = context.task.config.artifact_paths
    if declared:  # their folders, made as root in the room
        parents = sorted({str(PurePosixPath(path).parent) for path in declared})
        run_root(room, 'mkdir -p "$@"', context.trial_dir / "verifier" / "room.txt", parents)
    for path in dict.fromkeys(paths):
        copy = CappedStream(sandbox.export_tree(path), budget)
        chunks = iter(copy)
        first = next(chunks, None)
        if first is None:  # not there (an artifact the agent did not make)
            continue
        try:
            room.import_tree(itertools.chain([first], chunks), str(PurePosixPath(path).parent))
        except Exception:
            if not copy.is_cut:  # a cut archive ends in an error: what arrived is verified
                raise
        budget -= copy.size
        if copy.is_cut:
            with (context.trial_dir / "verifier" / "room.txt").open("a") as note:
                note.write(
                    f"the agent's files are over {MAX_ROOM_COPY_BYTES} bytes: the verifier's"
                    f" room holds {path}'s first entries only, and nothing after it\n"
                )
            return


class CappedStream:
    """A byte stream that ends after `limit` bytes (`is_cut` then says so): the agent's /app,
    which a sparse file can make any size, never costs the runner more than that to copy."""

    def __init__(self, chunks: Iterator[bytes], limit: int) -> None:
        self._chunks, self._limit = chunks, limit
        self.is_cut = False
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.size += len(chunk)
            if self.size > self._limit:
                self.is_cut = True
                close = getattr(self._chunks, "close", None)
                if close is not None:
                    close()
                return
            yield chunk


def run_root(
    sandbox: Sandbox,
    script: str,
    log: Path,
    args: Sequence[str] = (),
    failure: type[HemraError] = InfraError,
) -> str:
    """`script` run by /bin/sh as root within CLEAR_SECS, its output kept in `log` and
    returned; one that fails or runs past it raises `failure`, naming the output's end."""
    result = sandbox.exec(
        ["/bin/sh", "-c", script, "sh", *args],
        user=ROOT_USER,
        env={"HOME": "/root"},
        timeout=CLEAR_SECS,
        stdout=log,
        stderr=log,
        workdir="/",
    )
    said = log.read_text(errors="replace") if log.is_file() else ""
    if result.timed_out or result.exit_code != 0:
        raise failure(f"sandbox: clearing the verifier's room failed ({said.strip()[-300:]})")
    return said


def tests_archive(folders: list[Path], staging: str) -> bytes:
    """The tests as one tar for /, later folders over earlier ones, in `staging`/tests: both
    mode 0700 and everything in them root's, so no other user can even list them."""
    buffer = io.BytesIO()
    tests = f"{staging.strip('/')}{TESTS_DIR}"
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in (staging.strip("/"), tests):
            top = tarfile.TarInfo(name)
            top.type, top.mode, top.mtime = tarfile.DIRTYPE, 0o700, int(time.time())
            archive.addfile(top)
        for folder in folders:
            for entry in sorted(folder.rglob("*")):
                info = archive.gettarinfo(
                    entry, arcname=f"{tests}/{entry.relative_to(folder).as_posix()}"
                )
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode = (info.mode | 0o400) & 0o755
                if info.isfile():
                    with entry.open("rb") as handle:
                        archive.addfile(info, handle)
                else:
                    archive.addfile(info)
    return buffer.getvalue()
