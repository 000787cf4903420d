"""One running docker sandbox: commands run in it with deadlines, files in and out, its network
cut and given back, its processes killed, and the container removed with force."""

from __future__ import annotations

import contextlib
import io
import socket
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import requests
from docker.utils.socket import frames_iter

from pytest_hemra.execute.sandbox import AGENT_HOME, KILL_ALL, WORKDIR, ExecResult

DOCKER_ERRORS = (docker.errors.DockerException, requests.RequestException)
MAX_TREE_FILE_BYTES = 1 << 20
KILL_GRACE_SECS = 5.0


def remove_container(container: Any) -> None:
    """Remove with force; one already gone (or going: `hemra cancel` removed it) is fine."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as error:
        if error.status_code != 409:  # 409: its removal is already in progress
            raise


class DockerSandbox:
    def __init__(self, client: docker.DockerClient, container: Any) -> None:
        self.client = client
        self.container = container
        self.api = client.api
        self._taken: list[str] = []  # networks disconnected for a verifier

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
        exec_id = self.api.exec_create(
            self.container.id,
            list(argv),
            stdout=True,
            stderr=True,
            stdin=False,
            user=user,
            environment=dict(env),
            workdir=workdir,
        )["Id"]
        stream = self.api.exec_start(exec_id, stream=True, demux=True)
        failure: list[BaseException] = []

        def pump() -> None:
            try:
                with stdout.open("ab") as out, stderr.open("ab") as err:
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
            self._kill_processes(user)
            reader.join(KILL_GRACE_SECS)
        if failure and not timed_out:
            raise failure[0]
        exit_code = self.api.exec_inspect(exec_id).get("ExitCode")
        return ExecResult(
            exit_code=None if timed_out else exit_code,
            timed_out=timed_out,
            duration=time.monotonic() - started,
        )

    def start_interactive(
        self, argv: Sequence[str], *, user: str, env: Mapping[str, str], workdir: str = WORKDIR
    ) -> DockerInteractive:
        """Start argv with its stdin open, for a protocol spoken over stdio (ACP)."""
        exec_id = self.api.exec_create(
            self.container.id,
            list(argv),
            stdin=True,
            stdout=True,
            stderr=True,
            user=user,
            environment=dict(env),
            workdir=workdir,
        )["Id"]
        return DockerInteractive(self.api.exec_start(exec_id, socket=True))

    def _kill_processes(self, user: str) -> None:
        """Kill every process of `user` but PID 1: the exec's whole tree, whatever it spawned."""
        self.container.exec_run(list(KILL_ALL), user=user)

    def put_dir(self, source: Path, target: str) -> None:
        """Copy a host folder in as `target`, owned by root and read-only for the agent."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            archive.add(source, arcname=target.strip("/"), filter=_root_owned)
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

    def read_tree(self, path: str) -> dict[str, bytes]:
        """Regular files under `path` (relative names); files over 1 MiB read as empty."""
        try:
            chunks, _ = self.container.get_archive(path)
        except docker.errors.NotFound:
            return {}
        data = b"".join(chunks)
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                name = member.name.split("/", 1)[1] if "/" in member.name else member.name
                handle = archive.extractfile(member)
                if handle is not None and member.size <= MAX_TREE_FILE_BYTES:
                    files[name] = handle.read()
                else:
                    files[name] = b""
        return files

    def disconnect_network(self) -> None:
        self.container.reload()
        for network in self.container.attrs["NetworkSettings"]["Networks"]:
            if network != "none":
                self.client.networks.get(network).disconnect(self.container, force=True)
                self._taken.append(network)

    def reconnect_network(self) -> None:
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

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.close()


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = (info.mode | 0o444) & ~0o022
    if info.isdir() or info.mode & 0o100:
        info.mode |= 0o111
    return info
