"""One running docker sandbox: commands run in it with deadlines, files in and out, its network
cut and given back, its processes killed, the whole of it killed by the kernel and started again
(`empty`), and the container removed with force."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any

import docker
import docker.errors
import requests
from docker.utils.socket import frames_iter

from pytest_hemra.core.backoff import removal_secs
from pytest_hemra.core.errors import InfraError, Tampered, VerifierError
from pytest_hemra.execute.output import DEFAULT_OUTPUT_CAP, CappedOutput
from pytest_hemra.execute.sandbox import (
    AGENT_HOME,
    AGENT_USER,
    KILL_ALL,
    MAX_CHANGES_BYTES,
    MAX_FILE_OP_BYTES,
    MAX_TREE_BYTES,
    MAX_TREE_ENTRIES,
    MAX_TREE_FILE_BYTES,
    WORKDIR,
    Change,
    ExecResult,
    Tree,
)
from pytest_hemra.execute.sandbox.overlay import (
    overlay_changes,
    overlay_put,
    overlay_readable,
    overlay_tree,
    overlay_untouched,
)
from pytest_hemra.execute.sandbox.snapshot import SNAPSHOTS

DOCKER_ERRORS = (docker.errors.DockerException, requests.RequestException)
KILL_GRACE_SECS = 5.0
PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
END_USER_SECS = 5.0  # a user's processes killed and seen gone, else the sandbox emptied whole
STOP_SECS = 30.0  # a killed sandbox gone: its processes can take a while on a loaded machine
CHANGE_KINDS = {0: "modified", 1: "added", 2: "deleted"}  # the engine's diff Kind
# one entry of the engine's diff, its keys in either order: Kind, then the JSON string of its Path
CHANGE_ENTRY = re.compile(
    r'\{"Kind":(\d),"Path":("(?:[^"\\]|\\.)*")\}|\{"Path":("(?:[^"\\]|\\.)*"),"Kind":(\d)\}'
)
FILE_OP_TIMEOUT_SECS = 60.0
MAX_UNLISTED = 8  # large files met in folders `find` could not list, each a second pass
MAX_LISTING_BYTES = 64 << 20  # find's output for read_tree: about 500,000 entries
# What runs as the agent user for its protocol's file operations: a regular file only (a FIFO
# would block), its folders made as that user; errors in the C library's words, mapped back.
READ_FILE = """
if [ -d "$1" ]; then echo "$1: Is a directory" >&2; exit 1; fi
if [ -e "$1" ] && [ ! -f "$1" ]; then echo "$1: Invalid argument" >&2; exit 1; fi
exec head -c "$2" -- "$1"
"""
WRITE_FILE = """
if [ -d "$1" ]; then echo "$1: Is a directory" >&2; exit 1; fi
if [ -e "$1" ] && [ ! -f "$1" ]; then echo "$1: Invalid argument" >&2; exit 1; fi
mkdir -p -- "$(dirname -- "$1")" || exit 1
exec cat > "$1"
"""
KNOWN_ERRNOS = (
    errno.ENOENT,
    errno.EACCES,
    errno.EPERM,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.EINVAL,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.ELOOP,
    errno.ENAMETOOLONG,
)


REMOVE_ATTEMPTS = 5  # a removal racing another of the same container, tried again
REMOVE_PAUSE_SECS = 0.2
REMOVE_POLL_SECS = 0.5  # a slow removal under way, asked about again


def remove_container(container: Any, answers: Callable[[], bool] | None = None) -> None:
    """Remove with force, with its anonymous volumes (an image's VOLUME); one already gone (or
    going: `hemra cancel` removed it) is fine. Two removals of one container at once (a cancel
    and the trial's own teardown) can make the daemon fail one with a 500 ("failed to remove
    root filesystem ... directory not empty"): that one is tried again, and ends once the
    container is gone.

    A removal whose answer does not come within HEMRA_REMOVE_TIMEOUT_SECS while the engine
    `answers` pings is slow for what is in the container (an agent that left 100k files): it
    is waited for, up to HEMRA_REMOVE_PATIENCE_SECS, and never raised as the engine's outage
    (an agent would buy itself free reruns); past that, an InfraError (a retry used). Without
    `answers`, or when the engine does not answer, the timeout is raised (an outage)."""
    timeout, patience = removal_secs()
    for attempt in range(REMOVE_ATTEMPTS):
        try:
            _remove_once(container, timeout)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as error:
            if error.status_code == 409:  # its removal is already in progress
                return
            if error.status_code != 500 or attempt == REMOVE_ATTEMPTS - 1:
                raise
            time.sleep(REMOVE_PAUSE_SECS)
        except requests.Timeout:
            if answers is None or not answers():
                raise
            break
    _finish_removal(container, patience)


def _remove_once(container: Any, timeout: float) -> None:
    """One request to remove `container` with force, its answer awaited `timeout` seconds."""
    api = container.client.api
    url = api._url("/containers/{0}", container.id)
    response = api._delete(url, params={"v": True, "force": True}, timeout=timeout)
    api._raise_for_status(response)


def _finish_removal(container: Any, patience: float) -> None:
    """Wait up to `patience` for a slow removal of `container` (the engine goes on with it after
    its client gave up: asked again, it says it is under way) to end with the container gone."""
    deadline = time.monotonic() + patience
    while (left := deadline - time.monotonic()) > 0:
        try:
            _remove_once(container, left)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as error:
            if error.status_code not in (409, 500):  # 409: under way
                raise
        except requests.Timeout:
            continue
        time.sleep(min(REMOVE_POLL_SECS, max(deadline - time.monotonic(), 0)))
    raise InfraError(
        f"docker: sandbox {container.name} still being removed after {patience:g} s while its"
        " engine answers (HEMRA_REMOVE_PATIENCE_SECS): slowed by what the trial left in it"
    )


_NATIVE_DIFF: dict[str, bool] = {}  # engine address -> whether overlay2 diffs natively
# 127.0.0.11 as /proc/net/tcp writes it: Docker's embedded DNS listens there in every
# container of a user-defined network, on a port of its own
ENGINE_DNS = "0B00007F"
_REMAPPED: dict[str, bool] = {}  # engine address -> whether it remaps users (userns-remap)


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


def _has_native_diff(client: docker.DockerClient) -> bool:
    """Whether the engine's overlay2 driver uses its native diff (no redirected folders): its
    upper folders then hold exactly what a container changed. Asked once per engine."""
    address = str(client.api.base_url)
    if address not in _NATIVE_DIFF:
        try:
            info = client.info()
        except DOCKER_ERRORS:
            return False
        status = dict(info.get("DriverStatus") or [])
        _NATIVE_DIFF[address] = status.get("Native Overlay Diff") == "true"
        # user namespaces remap owners: a file written in its storage as root is not root's there
        _REMAPPED[address] = any("userns" in str(o) for o in info.get("SecurityOptions") or [])
    return _NATIVE_DIFF[address]


def _writes_storage(client: docker.DockerClient) -> bool:
    """Whether files written into a stopped container's storage here are owned as written."""
    return _has_native_diff(client) and not _REMAPPED.get(str(client.api.base_url), True)


class DockerSandbox:
    def __init__(
        self,
        client: docker.DockerClient,
        container: Any,
        *,
        runs_services: bool = False,
        kept: tuple[str, ...] = (),
        gateway_network: str | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        entrypoint: tuple[str, ...] = (),
    ) -> None:
        self.output_cap = output_cap  # each file an exec's output goes to: bytes kept at most
        # without: PID 1 is `sleep infinity` (the image has no ENTRYPOINT), and every other
        # process in it is one HEMRA exec'd, or a child of one
        self.runs_services = runs_services
        self.client = client
        self.container = container
        self.api = client.api
        self._taken: list[str] = []  # networks disconnected for a verifier
        self._kept = kept  # networks a verifier keeps: its task's services, no way out
        self._gateway_network = gateway_network  # HEMRA's, with no way out (None: a pool's)
        self._joined: list[str] = []  # networks joined for a verifier (its allowlist)
        self._halted = False  # killed and left stopped (`halt`): read through the engine alone
        self._restarted = False  # started again by `empty`: a PID 1 that then exits is the agent's
        self._entrypoint = entrypoint  # the image's ENTRYPOINT, run again by `empty`
        self._pid: int | None = None  # PID 1's on the engine's host (`listening_ports`)

    @property
    def halted(self) -> bool:
        return self._halted

    def put_offline(self, archive: bytes) -> bool:
        """Unpack `archive` (HEMRA's own, owners kept) into the halted container's storage on
        this host, where it appears when it starts again (overlay2 allows changes to its upper
        folder while unmounted): no engine round trip. False where that cannot be done."""
        if not self._halted or self.runs_services or not _writes_storage(self.client):
            return False
        return overlay_put(self.container.attrs, True, archive)

    @property
    def reads_storage(self) -> bool:
        if self.runs_services:  # its services may change what is read as it is read
            return False
        return overlay_readable(self.container.attrs, _has_native_diff(self.client))

    @property
    def image_user(self) -> str:
        """The task image's USER (the sandbox layer keeps it as a label), "" for none (root)."""
        labels = self.container.attrs.get("Config", {}).get("Labels") or {}
        return str(labels.get("hemra.image-user") or "")

    @property
    def image_path(self) -> str:
        """PATH in the container's environment (the image's ENV, as the engine holds it)."""
        for entry in self.container.attrs.get("Config", {}).get("Env") or ():
            name, _, value = str(entry).partition("=")
            if name == "PATH":
                return value
        return ""

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
    ) -> ExecResult:
        """Run argv to completion or until `timeout`, streaming its output to files."""
        started = time.monotonic()
        exec_id = self._exec_create(
            argv,
            stdout=True,
            stderr=True,
            stdin=False,
            user=user,
            environment=dict(env),
            workdir=workdir,
        )
        stream = self.api.exec_start(exec_id, stream=True, demux=True)
        failure: list[BaseException] = []

        def pump() -> None:
            try:  # each file up to the cap, its head and tail (`execute/output.py`)
                with contextlib.ExitStack() as files:
                    out = files.enter_context(CappedOutput(stdout, self.output_cap))
                    err = out
                    if stderr.absolute() != stdout.absolute():
                        err = files.enter_context(CappedOutput(stderr, self.output_cap))
                    for chunk_out, chunk_err in stream:
                        if chunk_out:
                            out.write(chunk_out)
                        if chunk_err:
                            err.write(chunk_err)
            except BaseException as error:  # surfaced to the caller below
                failure.append(error)

        reader = threading.Thread(target=pump, name="hemra-exec", daemon=True)
        reader.start()
        reader.join(timeout)
        timed_out = reader.is_alive()
        if timed_out:
            try:
                self._kill_processes(user)
            except DOCKER_ERRORS:  # no command runs in it any more (pids exhausted): all of it
                self.halt()
            reader.join(KILL_GRACE_SECS)
        if failure and not timed_out:
            raise failure[0]
        exit_code = None if timed_out else self.api.exec_inspect(exec_id).get("ExitCode")
        return ExecResult(
            exit_code=exit_code,
            timed_out=timed_out,
            duration=time.monotonic() - started,
        )

    def start_interactive(
        self, argv: Sequence[str], *, user: str, env: Mapping[str, str], workdir: str = WORKDIR
    ) -> DockerInteractive:
        """Start argv with its stdin open, for a protocol spoken over stdio (ACP)."""
        exec_id = self._exec_create(
            argv,
            stdin=True,
            stdout=True,
            stderr=True,
            user=user,
            environment=dict(env),
            workdir=workdir,
        )
        return DockerInteractive(self.api.exec_start(exec_id, socket=True))

    def _exec_create(self, argv: Sequence[str], **options: Any) -> str:
        """A command made ready to start; in a sandbox whose PID 1 exited after `empty` started
        it again (a root agent removed or replaced what it runs), VerifierError: the agent's."""
        if self._halted:
            raise RuntimeError("sandbox: a command asked of a halted sandbox (call empty first)")
        try:
            return str(self.api.exec_create(self.container.id, list(argv), **options)["Id"])
        except docker.errors.APIError as error:
            if self._restarted and error.status_code == 409:
                raise VerifierError(
                    f"sandbox: stopped after it was emptied and started again ({error.explanation})"
                ) from error
            raise

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

    def halt(self) -> None:
        """SIGKILL to PID 1 (the kernel kills its whole PID namespace: every process, whatever
        its name, thread state, user or session), then wait until the engine has it stopped."""
        if self._halted:
            return
        self._pid = None
        try:
            self.container.kill()
        except docker.errors.APIError as error:
            if error.status_code != 409:  # 409: not running (its PID 1 exited, or killed)
                raise
        try:
            self.api.wait(self.container.id, timeout=STOP_SECS, condition="not-running")
        except requests.exceptions.ReadTimeout as error:
            self.client.ping()  # an engine that does not answer: its outage, raised as such
            raise VerifierError(
                f"sandbox: still running {STOP_SECS:g}s after it was killed (a process the"
                " agent left stuck in the kernel)"
            ) from error
        self._halted = True

    def empty(self) -> None:
        """`halt`, then started again: a fresh PID 1 (docker-init, reaping), the entrypoint
        run again. A sandbox that does not start again, or whose PID 1 exits at once, was
        broken by what the agent changed (the engine answering): VerifierError."""
        self.halt()
        if self.runs_services and self._entrypoint:
            self._check_entrypoint()
        try:
            self.container.start()
        except docker.errors.APIError as error:
            self.client.ping()
            raise VerifierError(
                f"sandbox: did not start again after it was emptied ({error.explanation})"
            ) from error
        self._halted = False
        self._restarted = True

    def _check_entrypoint(self) -> None:
        """Before the image's entrypoint runs again (as root, beside the verifier): Tampered when
        the engine's diff says the agent changed what it runs (a path it names, or the program
        it names found on PATH); a diff too large to read is not checked, and says so."""
        try:
            changed = [change.path for change in self.changes()]
        except OverflowError as error:
            raise Tampered(
                "the sandbox's changes could not be checked before its entrypoint ran again",
                evidence=(f"/: {error}, not checked",),
            ) from error
        first = self._entrypoint[0]
        named = {arg for arg in self._entrypoint if arg.startswith("/")}
        if "/" not in first:
            named |= {f"{folder}/{first}" for folder in PATH}
        found = [path for path in changed if path in named]
        if found:
            raise Tampered(
                "the agent changed the image's entrypoint, which runs again when its sandbox is"
                " emptied",
                evidence=tuple(f"{path}: the image's ENTRYPOINT, run as root" for path in found),
            )

    def export_tree(self, path: str) -> Iterator[bytes]:
        """`path` as a tar stream (its last part the top folder), owners and modes kept."""
        try:
            chunks, _ = self.container.get_archive(path)
        except docker.errors.NotFound:
            return iter(())
        return iter(chunks)

    def import_tree(self, archive: Iterator[bytes], parent: str) -> None:
        """Unpack a tar stream (`export_tree`'s) under `parent`, streamed, owners and modes kept."""
        self.container.put_archive(parent, archive)

    def put_dir(self, source: Path, target: str) -> None:
        """Copy a host folder in as `target`, owned by root and read-only for the agent."""
        self.put({}, {target: source})

    def put(
        self, files: Mapping[str, bytes], dirs: Mapping[str, Path] = {}, owner: str | None = None
    ) -> None:
        """Files (by path) and host folders (by target) in, in one archive (one round trip to
        the engine): root's and read-only for the agent, or with `owner` ("uid:gid") that
        user's, modes kept."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for target, content in files.items():
                info = tarfile.TarInfo(target.strip("/"))
                info.size, info.mode, info.mtime = len(content), 0o644, int(time.time())
                archive.addfile(info, io.BytesIO(content))
            for target, source in dirs.items():
                keep = _root_owned if owner is None else _owned_by(owner)
                archive.add(source, arcname=target.strip("/"), filter=keep)
        self.container.put_archive("/", buffer.getvalue())

    def put_file(self, content: bytes, target: str, owner: str | None = None) -> None:
        """Write one file; with `owner` ("uid:gid") it and its new folders under the agent's
        home belong to that user, so a harness can keep writing its own config."""
        uid, gid = (int(part) for part in (owner or "0:0").split(":"))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            relative = target.strip("/")
            if owner and target.startswith(AGENT_HOME + "/"):
                parents = PurePosixPath(relative).parents
                for folder in reversed([p for p in parents if len(p.parts) > 2]):
                    info = tarfile.TarInfo(str(folder))
                    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
                    archive.addfile(info)
            info = tarfile.TarInfo(relative)
            info.size, info.mode, info.uid, info.gid = len(content), 0o644, uid, gid
            info.mtime = int(time.time())
            archive.addfile(info, io.BytesIO(content))
        self.container.put_archive("/", buffer.getvalue())

    def read_tree(self, path: str, since: Tree | None = None) -> Tree:
        """Regular files under `path` (relative names; a file `path` under its own name),
        bounded. Read from the engine's storage where this runner can (`overlay_tree`: the
        tree `since` is as the container started, changed as its upper folder says), else
        through the engine: its archive is streamed one member at a time, never held whole. At
        the first member over the per-file cap the stream is closed, before its data, and the
        tree is read again around every such file: their sizes listed inside the sandbox
        (`find`, as the agent user), the folders holding one fetched child by child. A large
        file the listing could not see (a folder the agent user cannot list) is gone around
        when met, up to `MAX_UNLISTED` of them; the total caps stop the read. A halted
        sandbox, where nothing runs to list it, is read in one stream, files over the cap read
        through and dropped; past `MAX_TREE_BYTES` of those it is started again (`empty`) and
        read as above."""
        if self._halted or not self.runs_services:  # nothing runs there but what HEMRA ran
            native = _has_native_diff(self.client)
            found = overlay_tree(self.container.attrs, native, path, since)
            if found is not None:
                return found
        tree = Tree()
        if self._halted:  # no command to list it: files over the cap are read through, unkept
            if self._stream_tree(path, "", tree, read_through=MAX_TREE_BYTES) is None:
                return tree
            self.empty()  # too much to read through: started again (nothing left of the agent's)
            tree = Tree()
        first = self._stream_tree(path, "", tree)
        if first is None:  # the usual case: nothing over the cap, one stream
            return tree
        tree = Tree()
        listing = self._list_sizes(path)
        oversized: dict[str, int] = {}
        around: set[str] = set()  # the folders (relative; "" is `path`) that hold one

        def skip(name: str, size: int) -> None:
            oversized[name] = tree.skipped[name] = size
            tree[name] = b""
            parts = PurePosixPath(name).parts
            around.update("/".join(parts[:depth]) for depth in range(len(parts)))

        skip(*first)
        for name, size in listing.items():
            if size > MAX_TREE_FILE_BYTES:
                skip(name, size)
        pending, surprises = [""], 0
        while pending and tree.stopped is None:
            relative = pending.pop()
            if relative not in around:
                unlisted = self._stream_tree(path, relative, tree)
                if unlisted is not None:  # in a folder the agent user cannot list: go around it
                    skip(*unlisted)
                    surprises += 1
                    if surprises > MAX_UNLISTED:
                        tree.stopped = f"{path}: more than {MAX_UNLISTED} unlisted large files"
                    elif relative in around:
                        pending.append(relative)
                continue
            prefix = relative + "/" if relative else ""
            children = {
                prefix + rest.split("/", 1)[0]
                for rest in (n[len(prefix) :] for n in listing.entries if n.startswith(prefix))
                if rest
            }
            pending.extend(sorted(children - oversized.keys(), reverse=True))
        return tree

    def read_start_tree(self, path: str) -> Tree:
        """`read_tree(path)` of the sandbox as it started, kept per image (see `snapshot.py`)."""
        if self.runs_services:  # its entrypoint may have changed it: read this sandbox's own
            return self.read_tree(path)

        def read() -> Tree:  # what no command has changed yet is the image's (`read_tree`'s since)
            tree = self.read_tree(path)
            attrs = self.container.attrs
            tree.as_image = overlay_untouched(attrs, _has_native_diff(self.client), path)
            return tree

        return SNAPSHOTS.tree(self.container.attrs["Image"], path, read)

    def _list_sizes(self, path: str) -> Listing:
        """Every entry under `path` with its size, as the agent user can list them; an image
        without GNU find (or a path that is not a folder) lists nothing."""
        command = 'find -H "$1" -mindepth 1 -printf "%y %s %P\\0" 2>/dev/null | head -c "$2"'
        exec_id = self.api.exec_create(
            self.container.id,
            ["sh", "-c", command, "sh", path, str(MAX_LISTING_BYTES)],
            stdout=True,
            stderr=False,
            user=AGENT_USER,
            workdir="/",
        )["Id"]
        listing = Listing()
        with tempfile.TemporaryFile() as spool:  # a long listing waits on disk, not in memory
            for chunk in self.api.exec_start(exec_id, stream=True):
                spool.write(chunk)
            spool.seek(0)
            for record in _records(spool):
                kind, _, rest = record.partition(" ")
                size, _, name = rest.partition(" ")
                if not name or not size.isdigit():
                    continue
                listing.entries.add(name)
                if kind == "f":
                    listing[name] = int(size)
        return listing

    def _stream_tree(
        self, root: str, relative: str, tree: Tree, read_through: int = 0
    ) -> tuple[str, int] | None:
        """Add the regular files of `root/relative` to `tree`, streamed from the engine's archive
        one member at a time; the connection is closed at the first member over a cap. Returns
        the name and size of a file over the per-file cap met there, before its data; with
        `read_through`, such files are named in `skipped` and their data read and dropped, up to
        that many bytes in all (the one past it is returned)."""
        path = str(PurePosixPath(root) / relative) if relative else root
        response = self.api._get(
            self.api._url("/containers/{0}/archive", self.container.id),
            params={"path": path},
            stream=True,
            headers={"Accept-Encoding": "identity"},
        )
        try:
            if response.status_code == 404:
                return None
            self.api._raise_for_status(response)
            parent = str(PurePosixPath(relative).parent) + "/" if "/" in relative else ""
            with tarfile.open(fileobj=response.raw, mode="r|") as archive:
                for index, member in enumerate(archive):
                    if index == 0 and not relative and member.isfile():
                        tree.is_file = True
                    if len(tree) + len(tree.skipped) >= MAX_TREE_ENTRIES:
                        tree.stopped = f"{path}: more than {MAX_TREE_ENTRIES} entries"
                        return None
                    if not member.isfile():
                        continue
                    name = member.name
                    if relative:
                        name = parent + name
                    elif "/" in name:
                        name = name.split("/", 1)[1]
                    if member.size > MAX_TREE_FILE_BYTES:
                        if member.size > read_through:  # unlisted: stop before its data
                            return name, member.size
                        read_through -= member.size  # the stream reads past it, unkept
                        tree.skipped[name] = member.size
                        tree[name] = b""
                        continue
                    if tree.size + member.size > MAX_TREE_BYTES:
                        tree.stopped = f"{path}: more than {MAX_TREE_BYTES} bytes"
                        return None
                    handle = archive.extractfile(member)
                    tree[name] = handle.read() if handle is not None else b""
                    tree.size += member.size
        finally:
            response.close()
        return None

    def read_file(self, path: str, *, user: str, limit: int = MAX_FILE_OP_BYTES) -> bytes:
        """One regular file as `user` reads it, by `head` run as that user in the sandbox."""
        code, out, err = self._run_with_input(
            ["sh", "-c", READ_FILE, "sh", path, str(limit + 1)], user=user, data=b"", limit=limit
        )
        if code != 0:
            raise _os_error(err, path)
        if len(out) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
        return out

    def write_file(self, path: str, content: bytes, *, user: str) -> None:
        """One file written by `cat` run as `user` in the sandbox, its content on stdin."""
        code, _, err = self._run_with_input(
            ["sh", "-c", WRITE_FILE, "sh", path], user=user, data=content, limit=0
        )
        if code != 0:
            raise _os_error(err, path)

    def _run_with_input(
        self, argv: Sequence[str], *, user: str, data: bytes, limit: int
    ) -> tuple[int | None, bytes, bytes]:
        """Run a file operation's argv (its path the fifth item) with `data` on its stdin; its
        exit code and output (stdout up to `limit` + 1 bytes, stderr up to 4 KiB), within
        `FILE_OP_TIMEOUT_SECS`."""
        exec_id = self._exec_create(argv, stdin=True, stdout=True, stderr=True, user=user)
        process = DockerInteractive(self.api.exec_start(exec_id, socket=True))
        out, err = bytearray(), bytearray()
        try:
            process.settimeout(FILE_OP_TIMEOUT_SECS)
            with contextlib.suppress(OSError):  # it may have exited already: its stderr says why
                process.send(data)
            process.close_stdin()
            for stream, chunk in process.frames():
                if stream == 1:
                    out += chunk[: limit + 1 - len(out)]
                else:
                    err += chunk[: 4096 - len(err)]
        except OSError as error:  # no answer in time: what still runs is the agent user's
            raise OSError(errno.EIO, f"no answer in {FILE_OP_TIMEOUT_SECS}s", argv[4]) from error
        finally:
            process.close()
        deadline = time.monotonic() + KILL_GRACE_SECS
        state = self.api.exec_inspect(exec_id)
        while state.get("Running") and time.monotonic() < deadline:
            time.sleep(0.02)
            state = self.api.exec_inspect(exec_id)
        return state.get("ExitCode"), bytes(out), bytes(err)

    def changes(self) -> list[Change]:
        """The engine's diff of the container against its image (Kind 0, 1, 2): read from its
        overlay2 folders on this host when the engine is local (`overlay.py`: the same answer,
        a thousand times faster), else asked of the engine, its answer read up to
        `MAX_CHANGES_BYTES` (past it, OverflowError) and parsed entry by entry."""
        found = overlay_changes(self.container.attrs, _has_native_diff(self.client))
        if found is not None:
            return found
        response = self.api._get(
            self.api._url("/containers/{0}/changes", self.container.id), stream=True
        )
        try:
            self.api._raise_for_status(response)
            body = response.raw.read(MAX_CHANGES_BYTES + 1, decode_content=True)
        finally:
            response.close()
        if len(body) > MAX_CHANGES_BYTES:
            raise OverflowError(f"the engine's diff is over {MAX_CHANGES_BYTES >> 20} MiB")
        text = body.decode(errors="replace")
        entries = [
            (json.loads(entry[1] or entry[2]), int(entry[0] or entry[3]))
            for entry in CHANGE_ENTRY.findall(text)
        ]
        if len(entries) != text.count('"Path":'):  # not the compact form: the slower parse
            entries = [(str(e["Path"]), int(e["Kind"])) for e in json.loads(text) or ()]
        return [Change(path, CHANGE_KINDS.get(kind, "modified")) for path, kind in entries]

    def disconnect_network(self) -> None:
        self.container.reload()
        for network in self.container.attrs["NetworkSettings"]["Networks"]:
            if network != "none" and network not in self._kept:
                self.client.networks.get(network).disconnect(self.container, force=True)
                self._taken.append(network)

    def only_gateway_network(self) -> bool:
        """Off every network but HEMRA's `hemra-gateway`, which has no route out (the gateway's
        and its egress proxy's ports on its host address are all it reaches): a verifier with
        its own allowlist. False where the sandbox has no such network (a pool's engine)."""
        if self._gateway_network is None:
            return False
        self.container.reload()
        networks = set(self.container.attrs["NetworkSettings"]["Networks"]) - set(self._kept)
        if networks == {self._gateway_network}:
            return True
        self.disconnect_network()
        self.client.networks.get(self._gateway_network).connect(self.container)
        self._joined.append(self._gateway_network)
        return True

    def reconnect_network(self) -> None:
        while self._joined:
            self.client.networks.get(self._joined.pop()).disconnect(self.container, force=True)
        while self._taken:
            self.client.networks.get(self._taken.pop()).connect(self.container)


class DockerInteractive:
    """A process's stdin to write and its multiplexed stdout/stderr to read, frame by frame."""

    def __init__(self, sock: Any) -> None:
        self._io = sock
        self._raw = getattr(sock, "_sock", sock)

    def send(self, data: bytes) -> None:
        self._raw.sendall(data)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_WR)

    def frames(self) -> Iterator[tuple[int, bytes]]:
        """(1 for stdout or 2 for stderr, bytes) until the process closes its output."""
        for stream, data in frames_iter(self._io, tty=False):
            yield int(stream), bytes(data)

    def settimeout(self, seconds: float) -> None:
        self._raw.settimeout(seconds)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.close()


class Listing(dict[str, int]):
    """A folder's regular files by relative name with their sizes; `entries` names every entry."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: set[str] = set()


def _records(spool: IO[bytes]) -> Iterator[str]:
    """NUL-terminated records of a spooled listing, read a block at a time."""
    rest = b""
    while block := spool.read(1 << 16):
        *records, rest = (rest + block).split(b"\0")
        yield from (record.decode(errors="replace") for record in records)


def _os_error(stderr: bytes, path: str) -> OSError:
    """The OSError a command in the sandbox met, from the C library's message it printed."""
    text = stderr.decode(errors="replace").strip()
    for code in KNOWN_ERRNOS:
        if os.strerror(code) in text:
            return OSError(code, os.strerror(code), path)
    return OSError(errno.EIO, text or "failed", path)


def _owned_by(owner: str) -> Callable[[tarfile.TarInfo], tarfile.TarInfo]:
    uid, gid = (int(part) for part in owner.split(":"))

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
        return info

    return owned


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = (info.mode | 0o444) & ~0o022
    if info.isdir() or info.mode & 0o100:
        info.mode |= 0o111
    return info
