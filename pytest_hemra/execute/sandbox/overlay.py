"""A container's changes against its image, and the files under one of its paths, read from the
engine's own storage on the engine's host: the overlay2 upper folder holds exactly what the
container wrote, so walking it is the engine's diff without the engine (which, on this
machine's Docker 20.10, takes 0.2-0.4 s a call, walking the image's layers too), and a tree
the container changed is the tree it started with, changed as the upper folder says (where
the engine's archive of it takes 40-60 ms). Read from outside the sandbox: nothing the agent
runs takes part. Used only where it gives the engine's answer: a local engine (the runner
reads the folder itself), the overlay2 driver with its native diff (no redirected folders,
no metadata-only copies), the container's folders as the engine names them in its inspect
answer; else None, and the caller asks the engine.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_hemra.execute.sandbox import (
    MAX_TREE_BYTES,
    MAX_TREE_ENTRIES,
    MAX_TREE_FILE_BYTES,
    Change,
    Tree,
)

MAX_CHANGES = 400_000  # about what MAX_CHANGES_BYTES of the engine's answer holds
OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")  # a folder hiding the layers below
COPIED_BY_REFERENCE = (  # the file's data, or its path, is in a layer below: not read here
    "trusted.overlay.metacopy",
    "user.overlay.metacopy",
    "trusted.overlay.redirect",
    "user.overlay.redirect",
)


def overlay_changes(attrs: Mapping[str, Any], native: bool) -> list[Change] | None:
    """The container's changes (`attrs`: its inspect answer), as `Sandbox.changes` gives them,
    or None when they cannot be read here. OverflowError past MAX_CHANGES paths."""
    storage = _folders(attrs, native)
    if storage is None:
        return None
    top, layers = storage
    found: list[Change] = []
    for root, folders, files in os.walk(top):
        for name in sorted(folders) + sorted(files):
            path = Path(root) / name
            inside = "/" + path.relative_to(top).as_posix()
            found.append(Change(inside, _kind(path, inside, layers)))
            if len(found) > MAX_CHANGES:
                raise OverflowError(f"the container's changes are over {MAX_CHANGES} paths")
    return found


def _kind(path: Path, inside: str, layers: list[Path]) -> str:
    """Deleted for a whiteout (a character device 0/0), modified for a path the image has,
    else added."""
    info = path.lstat()
    if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
        return "deleted"
    relative = inside.lstrip("/")
    if any(os.path.lexists(layer / relative) for layer in layers):
        return "modified"
    return "added"


def overlay_tree(
    attrs: Mapping[str, Any], native: bool, path: str, since: Tree | None
) -> Tree | None:
    """`Sandbox.read_tree(path)` from the container's storage, or None when it cannot be read
    here. `since` is the tree as read when the container started (its image's files under
    `path`): the answer is `since` changed as the upper folder says (files written replace
    theirs, whiteouts and opaque folders remove theirs). Without `since`, only a path the
    image's layers hold nothing under (or that the container made new) is read. Caps as
    `read_tree`'s: files over MAX_TREE_FILE_BYTES skipped, MAX_TREE_BYTES and MAX_TREE_ENTRIES
    in all (a tree past them is left to the engine, which says where it stopped)."""
    storage = _folders(attrs, native)
    if storage is None or (since is not None and not since.as_image):
        return None
    top, layers = storage
    relative = path.strip("/")
    try:
        if any(_through_link(layer, relative) for layer in (top, *layers)):
            return None
        if _removed_above(top, relative):  # the path's folder removed (or made a file)
            return Tree()
        target = top / relative
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            return Tree() if _is_whiteout(target) else None
        if _hidden_below(top, relative):
            since = Tree()
        elif since is None:
            if any(_holds_anything(layer / relative) for layer in layers):
                return None
            since = Tree()
        return _changed(since, target)
    except (OSError, _NotHere):
        return None


def overlay_put(attrs: Mapping[str, Any], native: bool, archive: bytes) -> bool:
    """Unpack `archive` into the container's upper folder (the container stopped: its overlay
    unmounted), owners and modes kept; each top entry must be new there. False where it cannot
    be written here (the caller asks the engine)."""
    storage = _folders(attrs, native)
    return storage is not None and _unpack(storage[0], archive)


def overlay_put_mounted(attrs: Mapping[str, Any], archive: bytes) -> bool:
    """Unpack `archive` into the running container's root as the engine mounted it on this
    host (its overlay2 merged folder: written through the overlay, as the engine's own archive
    put writes it), owners and modes kept; each top entry must be new there. For a container
    in which nothing but HEMRA's runs (the caller's word), so nothing inside races the writes.
    False where it cannot be written here: another driver, a folder that is not mounted in
    this runner's view (another machine's engine, another mount namespace)."""
    driver = attrs.get("GraphDriver") or {}
    merged = (driver.get("Data") or {}).get("MergedDir")
    if driver.get("Name") != "overlay2" or not merged:
        return False
    try:
        if not os.path.ismount(merged):
            return False
    except OSError:
        return False
    return _unpack(Path(merged), archive)


def _unpack(folder: Path, archive: bytes) -> bool:
    """`archive` unpacked under `folder`, owners and modes kept, where no top entry exists."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as members:
            names = {member.name.split("/", 1)[0] for member in members.getmembers()}
            if any(os.path.lexists(folder / name) for name in names):
                return False
            members.extractall(folder, numeric_owner=True, filter="tar")
    except (OSError, tarfile.TarError):
        return False
    return True


def image_has_file(image: Mapping[str, Any], relative: str) -> bool:
    """Whether the image (its inspect answer) holds a regular file at `relative`, read from its
    overlay2 layers on this host, top first: a layer with a whiteout, a link or a file on the
    way hides the layers below, as does an opaque folder. False where they are not here."""
    driver = image.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    if driver.get("Name") != "overlay2" or not data.get("UpperDir"):
        return False
    layers = [data["UpperDir"], *str(data.get("LowerDir") or "").split(":")]
    parts = relative.split("/")
    try:
        for layer in (Path(folder) for folder in layers if folder):
            if not layer.is_dir():
                return False  # another machine's engine
            hidden = False  # an opaque folder on the way: the layers below are hidden
            for end in range(1, len(parts) + 1):
                path = layer.joinpath(*parts[:end])
                if not os.path.lexists(path):
                    break
                if end == len(parts):
                    return stat.S_ISREG(path.lstat().st_mode)
                if path.is_symlink() or not path.is_dir():
                    return False  # a whiteout, a file or a link (resolved inside) on the way
                hidden = hidden or _is_opaque(path)
            if hidden:
                return False
    except OSError:
        return False
    return False


def overlay_readable(attrs: Mapping[str, Any], native: bool) -> bool:
    """Whether the container's storage can be read here (`overlay_tree` may answer)."""
    return _folders(attrs, native) is not None


def overlay_untouched(attrs: Mapping[str, Any], native: bool, path: str) -> bool:
    """Whether the container has changed nothing under `path` yet (no file, whiteout or opaque
    folder in its upper folder there): a tree read now is its image's, which `overlay_tree`
    can take as `since`."""
    storage = _folders(attrs, native)
    if storage is None:
        return False
    top, _ = storage
    relative = path.strip("/")
    try:
        if _through_link(top, relative) or _removed_above(top, relative):
            return False
        if _hidden_below(top, relative):
            return False
        target = top / relative
        if not target.exists():
            return True
        if target.is_symlink() or not target.is_dir():
            return False
        for root, folders, names in os.walk(target):
            here = Path(root)
            if names or any(
                _is_opaque(here / name) or (here / name).is_symlink() for name in folders
            ):
                return False
        return True
    except OSError:
        return False


class _NotHere(Exception):
    """What the upper folder holds is not read here (a metadata-only copy, a cap reached)."""


def _folders(attrs: Mapping[str, Any], native: bool) -> tuple[Path, list[Path]] | None:
    """The container's upper folder and its image's layers (top first), when readable here."""
    driver = attrs.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    upper, lower = data.get("UpperDir"), data.get("LowerDir")
    if not native or driver.get("Name") != "overlay2" or not upper or not lower:
        return None
    top = Path(upper)
    try:
        if not top.is_dir():  # another machine's engine
            return None
    except OSError:  # a folder this runner may not read (a rootful engine, a user's runner)
        return None
    return top, [Path(folder) for folder in str(lower).split(":") if folder]


def _through_link(layer: Path, relative: str) -> bool:
    """Whether a folder on the way to `relative` in `layer` is a link (resolved inside the
    container, not here)."""
    parts = relative.split("/") if relative else []
    return any(layer.joinpath(*parts[: index + 1]).is_symlink() for index in range(len(parts)))


def _removed_above(top: Path, relative: str) -> bool:
    """Whether a folder above `relative` is, in the upper folder, a whiteout or a file."""
    parts = relative.split("/") if relative else []
    for end in range(1, len(parts)):
        above = top.joinpath(*parts[:end])
        if above.is_symlink() or (above.exists() and not above.is_dir()):
            return True
    return False


def _hidden_below(top: Path, relative: str) -> bool:
    """Whether the upper folder hides the layers below at `relative` (it or a folder above it
    opaque, made new where the image's was removed)."""
    parts = relative.split("/") if relative else []
    return any(_is_opaque(top.joinpath(*parts[:end])) for end in range(len(parts), -1, -1))


def _holds_anything(folder: Path) -> bool:
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        return True
    return folder.is_dir() and any(folder.iterdir())


def _changed(since: Tree, target: Path) -> Tree:
    """`since` with what the upper folder holds under `target` applied; past a cap, _NotHere
    (checked as files are read: the agent's files never all in memory first)."""
    files = _Files(since)
    if target.is_dir():
        for root, folders, names in os.walk(target):
            here = Path(root)
            prefix = here.relative_to(target).as_posix()
            prefix = "" if prefix == "." else prefix + "/"
            if prefix and _is_opaque(here):  # the image's files under it are gone
                files.drop(prefix.rstrip("/"), below_only=True)
            for name in folders:  # a folder where the image may have had a file; a link
                if (here / name).is_symlink():  # where it had a folder
                    files.drop(prefix + name)
                else:  # a folder merged with the image's (unless opaque: met below)
                    files.drop_file(prefix + name)
            folders[:] = [name for name in folders if not (here / name).is_symlink()]
            for name in names:
                files.take(here / name, prefix + name)
    tree = Tree()
    for name in sorted(files.content):
        tree[name] = files.content[name]
        if name in files.skipped:
            tree.skipped[name] = files.skipped[name]
    tree.size = files.size
    return tree


class _Files:
    """The tree being changed, its caps held as it changes."""

    def __init__(self, since: Tree) -> None:
        self.content = dict(since)
        self.skipped = dict(since.skipped)
        self.size = sum(len(data) for data in since.values())

    def take(self, path: Path, name: str) -> None:
        """One entry of the upper folder: a regular file read (over the cap: skipped), anything
        else (a whiteout, a link, a device) removes the image's file or folder of that name."""
        self.drop(name)
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode):
            return
        if any(_xattr(path, key) is not None for key in COPIED_BY_REFERENCE):
            raise _NotHere
        if len(self.content) >= MAX_TREE_ENTRIES:
            raise _NotHere
        if info.st_size > MAX_TREE_FILE_BYTES:
            self.content[name], self.skipped[name] = b"", info.st_size
            return
        if self.size + info.st_size > MAX_TREE_BYTES:
            raise _NotHere
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(descriptor, "rb") as handle:  # the entry met, never a link made since
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise _NotHere
            data = handle.read(MAX_TREE_FILE_BYTES)
        self.content[name] = data
        self.size += len(data)

    def drop_file(self, name: str) -> None:
        if name in self.content:
            self.size -= len(self.content.pop(name))
            self.skipped.pop(name, None)

    def drop(self, name: str, below_only: bool = False) -> None:
        """The image's file `name` (unless `below_only`) and everything under folder `name`."""
        inside = name + "/"
        gone = [key for key in self.content if key.startswith(inside)]
        if not below_only and name in self.content:
            gone.append(name)
        for key in gone:
            self.size -= len(self.content.pop(key))
            self.skipped.pop(key, None)


def _is_whiteout(path: Path) -> bool:
    info = path.lstat()
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == 0


def _is_opaque(folder: Path) -> bool:
    return (
        folder.is_dir()
        and not folder.is_symlink()
        and any(_xattr(folder, key) == b"y" for key in OPAQUE)
    )


def _xattr(path: Path, key: str) -> bytes | None:
    try:
        return os.getxattr(path, key, follow_symlinks=False)
    except OSError:
        return None
