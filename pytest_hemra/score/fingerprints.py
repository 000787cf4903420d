"""Files of a sandbox read through the engine's archive (`Sandbox.export_tree`), never by a
tool inside the sandbox: streamed a member at a time, never held whole. A file's fingerprint
(its md5 and sha256, a link's target, or that it is a folder) for tamper evidence
(`score/tamper.py`), bounded by the bytes streamed."""

from __future__ import annotations

import base64
import hashlib
import io
import posixpath
import tarfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pytest_hemra.execute.sandbox import Sandbox

MAX_SUSPECT_BYTES = 1 << 30  # streamed from the engine to fingerprint files, in all
MAX_BATCH_BYTES = 256 << 20  # one folder's archive, read for several of them at once
BATCH_MIN = 8  # files asked for in one folder: read as one archive
CHUNK = 1 << 16


@dataclass(frozen=True)
class Fingerprint:
    """A changed path as the engine's archive holds it: a regular file's digests, a link's
    target ("" for a device or FIFO), or a folder."""

    md5: str = ""
    sha256: str = ""
    link: str | None = None
    size: int = 0
    is_folder: bool = False
    is_unread: bool = False  # a file over the bytes left to read: not hashed


def fingerprints(
    sandbox: Sandbox, paths: Iterable[str], added: set[str]
) -> tuple[dict[str, Fingerprint], set[str]]:
    """Each path's fingerprint, streamed from the engine's archive (what is not there is left
    out), and the paths left unread past `MAX_SUSPECT_BYTES` streamed. A folder the agent
    added, or one holding `BATCH_MIN` of the paths, is read once for all it holds (up to
    `MAX_BATCH_BYTES`); the rest one request each."""
    pending, found = set(paths), dict[str, Fingerprint]()
    budget = [MAX_SUSPECT_BYTES]
    per_folder = Counter(posixpath.dirname(path) for path in pending)
    roots: set[str] = set()
    for path in pending:
        top = next((folder for folder in _parents(path) if folder in added), None)
        if top is None and per_folder[posixpath.dirname(path)] >= BATCH_MIN:
            top = posixpath.dirname(path)
        if top is not None:
            roots.add(top)
    for root in sorted(roots, key=len):  # outermost first: it serves what is inside it
        left = {path for path in pending - found.keys() if path.startswith(root + "/")}
        if left and budget[0] > 0:
            found |= _read_folder(sandbox, root, left, budget)
    for path in sorted(pending - found.keys()):
        if budget[0] <= 0:
            break
        single = fingerprint(sandbox, path, budget[0])
        if single is not None:
            budget[0] -= single.size
            found[path] = single
    unread = {path for path, seen in found.items() if seen.is_unread}
    if budget[0] <= 0:
        unread |= pending - found.keys()
    return {p: seen for p, seen in found.items() if not seen.is_unread}, unread


def fingerprint(sandbox: Sandbox, path: str, limit: int = MAX_SUSPECT_BYTES) -> Fingerprint | None:
    """The fingerprint of `path` (a file's digests streamed, never held whole; one over `limit`
    bytes is not read), or None when it is not there."""
    with archive_of(sandbox, path) as archive:
        if archive is None:
            return None
        member = next(iter(archive), None)
        if member is None:
            return None
        if member.islnk():  # alone in its archive, a hard link is the file it shares
            member.type = tarfile.REGTYPE
        return _fingerprint_of(archive, member, limit)


def _read_folder(
    sandbox: Sandbox, root: str, wanted: set[str], budget: list[int]
) -> dict[str, Fingerprint]:
    """The fingerprints of the `wanted` paths under `root`, from one archive of it; stops past
    `MAX_BATCH_BYTES` (what is left is read one by one) or the budget."""
    found: dict[str, Fingerprint] = {}
    streamed = 0
    parent = posixpath.dirname(root)
    with archive_of(sandbox, root) as archive:
        if archive is None:
            return found
        for member in archive:
            streamed += member.size
            budget[0] -= member.size
            if streamed > MAX_BATCH_BYTES or budget[0] <= 0:
                break
            path = posixpath.join(parent, member.name.rstrip("/"))
            if path in wanted and not member.islnk():  # a hard link: read alone
                found[path] = _fingerprint_of(archive, member, budget[0])
    return found


def _fingerprint_of(archive: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> Fingerprint:
    if member.isdir():
        return Fingerprint(is_folder=True)
    if member.issym():
        return Fingerprint(link=member.linkname)
    if not member.isfile():
        return Fingerprint(link="")  # a device, a FIFO: no package ships one here
    if member.size > limit:
        return Fingerprint(size=member.size, is_unread=True)
    md5, sha256 = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    handle = archive.extractfile(member)
    if handle is not None:
        while block := handle.read(CHUNK):
            md5.update(block)
            sha256.update(block)
    digest = base64.urlsafe_b64encode(sha256.digest()).rstrip(b"=").decode()
    return Fingerprint(md5=md5.hexdigest(), sha256=digest, size=member.size)


class Archive:
    """The engine's tar stream of a path, read one member at a time (None: not there)."""

    def __init__(self, sandbox: Sandbox, path: str) -> None:
        self._chunks = sandbox.export_tree(path)
        self._archive: tarfile.TarFile | None = None

    def __enter__(self) -> tarfile.TarFile | None:
        stream = _ChunkReader(self._chunks)
        if not stream.has_data():
            return None
        self._archive = tarfile.open(fileobj=stream, mode="r|")
        return self._archive

    def __exit__(self, *_: object) -> None:
        if self._archive is not None:
            self._archive.close()
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def archive_of(sandbox: Sandbox, path: str) -> Archive:
    """The engine's tar stream of `path`, as a context: a `TarFile` read in stream mode, or
    None when the path is not there."""
    return Archive(sandbox, path)


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (the engine's archive stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def has_data(self) -> bool:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            self._pending = memoryview(chunk)
        return True

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if not self.has_data():
            return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def _parents(path: str) -> Iterator[str]:
    """The folders holding `path`, outermost first (not /)."""
    parts = path.strip("/").split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        yield "/" + "/".join(parts[:depth])
