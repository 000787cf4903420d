"""The Sandbox protocol: what a trial needs from wherever its task runs.

The docker provider is the default; others plug in through the
`pytest_hemra_sandbox_providers` hook, and `providers.py` builds the one a run's `[sandbox]`
names. A provider declares its capabilities; a run that `require`s one it lacks is refused at
resolve. A pool (`SandboxPool`, e.g. `[[sandbox.engines]]`) places each trial on one of several
providers first; the trial then talks to that provider alone. A provider whose engine can stop
answering says so (`SandboxProvider.engine_error`), and the runner waits for it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.output import DEFAULT_OUTPUT_CAP
from pytest_hemra.resolve.datasets import Task

if TYPE_CHECKING:
    from pytest_hemra.execute.sandbox.cleaning import Leftover
    from pytest_hemra.resolve.spec import EngineSettings
    from pytest_hemra.store import Store

AGENT_USER = "1000:1000"
ROOT_USER = "0:0"
AGENT_HOME = "/home/agent"
WORKDIR = "/app"
KILL_ALL = ("/bin/sh", "-c", "kill -9 -1")  # as a user: every process of it but PID 1
# Reading a sandbox's tree (`read_tree`): a file over the per-file cap is read as empty and named
# in the tree's `skipped`; the read stops at the total bytes or entries cap (`stopped` says why).
MAX_TREE_FILE_BYTES = 1 << 20
MAX_TREE_BYTES = 128 << 20
MAX_TREE_ENTRIES = 100_000
# One file an agent reads through its protocol (ACP's fs/read_text_file, SdkAgent.read_file).
MAX_FILE_OP_BYTES = 16 << 20
MAX_NOTED = 1000  # skipped files a trial folder's notes name (all are counted)


@dataclass(frozen=True)
class Limits:
    cpus: float | None = None
    memory_mb: int | None = None
    pids: int = 1024
    disk_mb: int | None = None  # the container's writable layer (`storage_opt size`)


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    timed_out: bool
    duration: float


@dataclass(frozen=True)
class Mount:
    """A host path made visible in the sandbox (read-only unless said otherwise)."""

    source: Path
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class SandboxRequest:
    """What one trial asks of a provider: the task's image, limits, labels and network."""

    image: str
    limits: Limits
    network: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    mounts: tuple[Mount, ...] = ()
    gateway_port: int | None = None  # where the run's gateway listens: the one port let in
    # a multi-container task's network of its services: joined as `main` before the sandbox
    # starts, and kept when the verifier's network is cut (it reaches only the task's services)
    services_network: str | None = None
    proxy_port: int | None = None  # the gateway's egress proxy (an allowlist task): let in too
    output_cap: int = DEFAULT_OUTPUT_CAP  # bytes kept of each file an exec's output goes to
    # the runner variables a task's env templates may read (the run's `[sandbox] pass_env`):
    # its compose services' `${VAR}`s are filled from these alone
    pass_env: tuple[str, ...] = ()
    # placed before it starts, root's and read-only for the agent (the instruction, the
    # oracle's solution): into its storage on this host where it can be, no request carrying them
    files: Mapping[str, bytes] = field(default_factory=dict)
    folders: Mapping[str, Path] = field(default_factory=dict)


class Tree(dict[str, bytes]):
    """Regular files under a path by relative name, as `read_tree` bounded them: `skipped` names
    the files over the per-file cap (read as empty) with their sizes; `stopped` says why the read
    ended before the whole tree (a cap reached), else None; `size` counts the bytes read."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped: dict[str, int] = {}
        self.stopped: str | None = None
        self.size = 0
        self.is_file = False  # the path read was a regular file (held under its own name)
        self.as_image = False  # read where the container had changed nothing: its image's files

    def notes(self) -> dict[str, Any] | None:
        """What the trial folder keeps of a bounded read (`tree-notes.json`), or None: the
        first `MAX_NOTED` files skipped by name (the agent's names: it may leave 100,000s),
        and how many in all."""
        if not self.skipped and self.stopped is None:
            return None
        return {
            "schema_version": 1,
            "skipped": self.noted_skips(),
            "skipped_files": len(self.skipped),
            "stopped": self.stopped,
        }

    def noted_skips(self) -> dict[str, int]:
        """The first `MAX_NOTED` skipped files with their sizes."""
        return dict(itertools.islice(self.skipped.items(), MAX_NOTED))


# The engine's diff of a sandbox (`changes`) read at most this big (about 400,000 paths)
MAX_CHANGES_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class Change:
    """One path the engine says differs from the sandbox's image (`Sandbox.changes`): `kind` is
    "modified", "added" or "deleted"; a folder whose content changed shows as modified."""

    path: str
    kind: str


class Sandbox(Protocol):
    """A running sandbox for one trial; closed (and gone) when its context exits."""

    # whether the image's entrypoint runs the task's own services (started again by `empty`)
    runs_services: bool

    @property
    def halted(self) -> bool:
        """Killed whole and left stopped (`halt`), not started again yet."""

    def put_local(self, archive: bytes) -> bool:
        """A tar (HEMRA's own) put into the sandbox without the engine, where its storage is on
        this host: halted, to appear when it starts again; running, only once nothing of the
        agent's runs in it. False where it cannot be (then `import_tree`, through the engine)."""

    @property
    def reads_storage(self) -> bool:
        """Whether its files are read from the engine's storage on this host (`read_tree`
        then costs the engine nothing)."""

    @property
    def image_user(self) -> str:
        """The task image's USER ("" for none: root)."""

    @property
    def image_path(self) -> str:
        """The PATH of the sandbox's environment as the engine holds it (the image's, which
        the verifier's commands are looked up in); "" when it has none."""

    def exec(
        self,
        argv: Sequence[str],
        *,
        user: str,
        env: Mapping[str, str],
        timeout: float,
        stdout: Path,
        stderr: Path,
        workdir: str = WORKDIR,
        exit_status: bool = True,
    ) -> ExecResult:
        """Run argv to completion or until `timeout`, streaming its output to files; without
        `exit_status`, its exit code is not asked for (None: a caller that reads only what the
        command wrote, one engine request fewer)."""
        ...

    def start_interactive(
        self, argv: Sequence[str], *, user: str, env: Mapping[str, str], workdir: str = WORKDIR
    ) -> Any: ...

    def put_dir(self, source: Path, target: str) -> None: ...

    def put(
        self, files: Mapping[str, bytes], dirs: Mapping[str, Path] = {}, owner: str | None = None
    ) -> None:
        """Files (by path) and host folders (by target) in at once: root's, read-only for the
        agent, or `owner`'s ("uid:gid")."""

    def export_tree(self, path: str) -> Iterator[bytes]:
        """`path` as a tar stream, owners and modes kept (nothing when it does not exist)."""

    def import_tree(self, archive: Iterator[bytes], parent: str) -> None:
        """Unpack `export_tree`'s stream (of this sandbox or another) under `parent`."""

    def put_file(self, content: bytes, target: str, owner: str | None = None) -> None: ...

    def read_tree(self, path: str, since: Tree | None = None) -> Tree:
        """Regular files under `path`, bounded: streamed, never the whole archive in memory; files
        over `MAX_TREE_FILE_BYTES` are never kept, totals capped (see `Tree`). A halted
        sandbox is read through the engine alone. `since`, the tree `read_start_tree` gave,
        lets a sandbox answer with what changed since (the engine's storage, read where it is
        local)."""

    def read_start_tree(self, path: str) -> Tree:
        """`read_tree(path)` before anything but HEMRA's own files (outside `WORKDIR`) was put in
        or ran: a sandbox may answer from an earlier sandbox of its image."""

    def read_file(self, path: str, *, user: str, limit: int = MAX_FILE_OP_BYTES) -> bytes:
        """One file as `user` reads it, inside the sandbox: that user's permissions, links
        resolved there. Raises the OSError that user met (FileNotFoundError, PermissionError,
        IsADirectoryError; EFBIG over `limit`, EINVAL for what is not a regular file)."""

    def write_file(self, path: str, content: bytes, *, user: str) -> None:
        """Write one file as `user` (its missing folders made as that user), inside the sandbox,
        never through the engine's root. Raises the OSError that user met."""

    def changes(self) -> list[Change]:
        """What changed in the sandbox's filesystem against its image, as the engine (not a tool
        inside the sandbox) sees it. Raises OverflowError when the engine's answer is over
        `MAX_CHANGES_BYTES` (what is read of it stays bounded)."""

    def empty(self) -> None:
        """Every process but a fresh PID 1 gone, by the kernel: the sandbox killed whole (its
        PID namespace with it) and started again, files, networks and labels kept; the image's
        entrypoint (its services) runs again. Raises VerifierError when what the agent left
        keeps it from stopping or starting again (the trial's failure, not the engine's)."""

    def end_user(self, user: str) -> bool:
        """Every process of `user` ("uid:gid") killed by the kernel (`kill -9 -1` as that user) and
        seen gone in the engine's own listing (numbers, never names); False when that cannot
        be done (the pids limit full, the image's shell changed): `empty` the sandbox then. For
        a non-root agent, which can neither change user nor signal anyone else's process."""

    def end_all_but_init(self) -> bool:
        """Every process but PID 1 killed by the kernel, from outside the sandbox, and seen
        gone, where PID 1 is one no process in the sandbox can trace or signal (HEMRA's keeper):
        a root agent's leftovers ended without a restart. False where that cannot be done (the
        default): `empty` the sandbox then."""
        return False

    @property
    def missed(self) -> str | None:
        """Why the last `end_all_but_init` fell back where PID 1 is the keeper (which step ran
        out of time or failed), for the trial's folder; None when it did not."""
        return None

    def listening_ports(self) -> frozenset[int] | None:
        """The TCP ports something in the sandbox listens on, read from outside it (its network
        namespace as the engine's host sees it); None where that cannot be read here."""

    def halt(self) -> None:
        """Killed whole, as `empty`, and left stopped: files can still be read (`read_tree`,
        `export_tree`) and the network changed; commands run again only after `empty`."""

    def disconnect_network(self) -> None: ...

    def only_gateway_network(self) -> bool:
        """Only HEMRA's network without a route out, where the egress proxy is reached (a
        verifier's allowlist); False where there is none (the caller cuts the network)."""

    def reconnect_network(self) -> None:
        """Give back the networks `disconnect_network` (or `only_gateway_network`) took (the
        next step of a task)."""


class SandboxProvider(Protocol):
    """Where trials' sandboxes run. The runner asks a provider for what it can do and never
    checks which provider it has: every capability is a member here. The first members each
    provider implements; the others have defaults, which a provider inherits by subclassing
    `SandboxProvider` (HEMRA's docker provider does), each saying what a provider without the
    capability does."""

    name: str
    engine: str | None = None  # its engine's address, named in waits for it (None: several)

    @property
    def capabilities(self) -> frozenset[str]:
        """What it can do, for a run's `require` (and `disk_limit` for a task's storage_mb)."""

    def check(self) -> None:
        """Raise InfraError if the provider cannot run anything right now."""

    def prepare(self, task: Task, default_image: str) -> str:
        """Build (or find cached) the task's sandbox image; return its reference. Called at
        resolve for each distinct task environment (an error refuses the run), then by each
        trial: once cached, it should cost next to nothing."""

    def open(self, request: SandboxRequest) -> AbstractContextManager[Sandbox]: ...

    def gateway_host(self) -> str | None:
        """The runner's address as sandboxes see it, where the gateway listens for them."""

    def remove_sandboxes(self, labels: Mapping[str, str]) -> int:
        """Remove at once every sandbox carrying all `labels` (a cancelled or abandoned trial's,
        a run's); return how many there were."""

    def gateway_hosts(self) -> list[str]:
        """Every address besides `gateway_host` the gateway must listen on for this provider's
        sandboxes (a pool's engines each reach the runner at their own). Default: none."""
        return []

    def release(self, run_id: str, ports: Sequence[int]) -> None:
        """A runner process is done with a run: what the provider opened for its gateway's
        `ports` (the gateway's, its egress proxy's) is closed again, and what the run holds
        that no process uses any more (its network) removed. Called while the gateway still
        holds its ports. Default: nothing to release."""
        return None

    def engine_error(self, engine: str | None = None) -> str | None:
        """None when its engine answers now, else why not (a Docker daemon restarted: the
        runner waits for it rather than spending a trial's retries, `run/outage.py`); a pool's
        `engine` by name, else any of its engines. Default: it always answers."""
        return None

    def kept(self) -> dict[str, str]:
        """What its engine kept that HEMRA could not remove when this process first reached it
        (`gateway_host`): each object's name with what to do. Each runner's start tries
        again. Default: nothing."""
        return {}

    def remove_leftovers(self, is_over: Callable[[str], bool]) -> int:
        """Once its engine answers again (and before a runner's first trial): remove what it
        holds for trials that are over (`is_over`, by trial id); return how many sandboxes
        that was. Default: it leaves nothing behind (0)."""
        return 0

    def clean(self, is_over: Callable[[str], bool], *, dry_run: bool) -> list[Leftover]:
        """`hemra clean`: every object of HEMRA's on its engine that no live trial owns (of
        trials that are over, by `is_over`; networks no sandbox uses; firewall rules of
        runners gone), removed unless `dry_run`; what was found. Default: none."""
        return []

    def placement(self) -> SandboxPool | None:
        """The pool that places each trial on one of several engines before its sandbox opens
        (`SandboxPool.place`), or None: every trial runs on this provider. Default: None."""
        return None

    def pooled(
        self, engines: Sequence[EngineSettings], store: Store | None, owner: str, source: str
    ) -> SandboxProvider | None:
        """This provider spread over a run's `[[sandbox.engines]]` (`owner` holds their slots
        in `store`; `source` is named in errors), or None when it cannot be: a run naming
        engines is then refused. Default: None."""
        return None

    def open_services(
        self, task: Task, request: SandboxRequest, logs: Path
    ) -> AbstractContextManager[str | None]:
        """A multi-container task's services running beside the trial until the context exits
        (their output kept under `logs`): the network the sandbox joins as `main`
        (`SandboxRequest.services_network`). Default: such a task is refused, InfraError."""
        where = task.compose.path if task.compose is not None else task.path
        raise InfraError(
            f"{where}: the {self.name} sandbox provider cannot run a task's compose services"
        )


@dataclass(frozen=True)
class Placement:
    """Where a pool put one trial: the engine's name, the provider bound to it, and the
    runner's address as that engine's sandboxes see it (where the gateway listens for them)."""

    engine: str
    provider: SandboxProvider
    gateway_host: str


class SandboxPool(Protocol):
    """Several providers behind one: each trial is placed on one with free capacity."""

    def place(
        self, trial: str, task: Task, default_image: str
    ) -> AbstractContextManager[Placement]:
        """Hold a slot on an engine for the trial until the context exits; an exception from
        the trial makes the pool check that engine (one that stopped answering is marked down)."""

    def engine_error(self, engine: str | None = None) -> str | None:
        """None when the pool's engine `engine` (by name; else any of them) answers now, else
        why not (`SandboxProvider.engine_error`)."""


def run_as_owner(
    sandbox: Sandbox, argv: Sequence[str], *, timeout: float, logs: Path, name: str = ""
) -> ExecResult:
    """Run a check in /app as the user that owns it (so what it writes there stays the agent
    user's), its output kept as `logs/[name.]stdout.txt` and `stderr.txt`."""
    return sandbox.exec(
        argv,
        user=AGENT_USER,
        env={"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=timeout,
        stdout=_log(logs, name, "stdout"),
        stderr=_log(logs, name, "stderr"),
        workdir=WORKDIR,
    )


def kill_agent_processes(sandbox: Sandbox, logs: Path, user: str = AGENT_USER) -> None:
    """Kill every process the agent's user runs in the sandbox (all but PID 1): whatever an
    agent started, when its turn ends past its deadline or its protocol session closes. A root
    agent's are left to the emptying that follows the turn (`Sandbox.empty`)."""
    if user.split(":")[0] in ("0", "root"):
        return
    sandbox.exec(
        KILL_ALL,
        user=user,
        env={},
        timeout=10,
        stdout=logs / "kill.out",
        stderr=logs / "kill.err",
    )


def output_of(logs: Path, name: str = "") -> str:
    """What `run_as_owner` kept of a command: its stdout, then its stderr."""
    return "".join(
        _log(logs, name, stream).read_text(errors="replace") for stream in ("stdout", "stderr")
    )


def _log(logs: Path, name: str, stream: str) -> Path:
    return logs / (f"{name}.{stream}.txt" if name else f"{stream}.txt")
