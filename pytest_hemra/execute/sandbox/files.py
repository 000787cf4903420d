"""Files in and out of a running docker sandbox: host folders and files put in as one archive
(root's and read-only for the agent, or a user's), trees exported and imported as tar streams,
and one file read or written as a user inside the sandbox (that user's permissions, links
resolved there), for an agent's protocol; and a process's stdin and multiplexed output."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import socket
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import docker.errors
from docker.utils.socket import frames_iter

from pytest_hemra.execute.sandbox import AGENT_HOME, MAX_FILE_OP_BYTES

KILL_GRACE_SECS = 5.0
FILE_OP_TIMEOUT_SECS = 60.0
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


def files_archive(
    files: Mapping[str, bytes], dirs: Mapping[str, Path] = {}, owner: str | None = None
) -> bytes:
    """One tar of files (by path) and host folders (by target), to unpack at /: root's and
    read-only for the agent, or with `owner` ("uid:gid") that user's, modes kept."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for target, content in files.items():
            info = tarfile.TarInfo(target.strip("/"))
            info.size, info.mode, info.mtime = len(content), 0o644, int(time.time())
            archive.addfile(info, io.BytesIO(content))
        for target, source in dirs.items():
            keep = _root_owned if owner is None else _owned_by(owner)
            archive.add(source, arcname=target.strip("/"), filter=keep)
    return buffer.getvalue()


class FileTransfer:
    """What `DockerSandbox` puts in and takes out of its container."""

    container: Any
    api: Any

    if TYPE_CHECKING:

        def _exec_create(self, argv: Sequence[str], **options: Any) -> str: ...

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
        self.container.put_archive("/", files_archive(files, dirs, owner))

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
