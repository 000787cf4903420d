"""A sandbox's tree read, bounded: from the engine's storage on this host where it can be
(`overlay.py`), else streamed from the engine's archive one member at a time, around every file
over the per-file cap (see `TreeReads.read_tree`)."""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import IO, TYPE_CHECKING, Any

import docker

from pytest_hemra.execute.sandbox import (
    AGENT_USER,
    MAX_TREE_BYTES,
    MAX_TREE_ENTRIES,
    MAX_TREE_FILE_BYTES,
    Tree,
    storage,
)
from pytest_hemra.execute.sandbox.overlay import overlay_tree, overlay_untouched
from pytest_hemra.execute.sandbox.snapshot import SNAPSHOTS

MAX_UNLISTED = 8  # large files met in folders `find` could not list, each a second pass
MAX_LISTING_BYTES = 64 << 20  # find's output for read_tree: about 500,000 entries


class TreeReads:
    """How `DockerSandbox` reads the files under a path of its container."""

    client: docker.DockerClient
    container: Any
    api: Any
    runs_services: bool
    _halted: bool

    if TYPE_CHECKING:

        def empty(self) -> None: ...

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
            native = storage.has_native_diff(self.client)
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
            tree.as_image = overlay_untouched(attrs, storage.has_native_diff(self.client), path)
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
