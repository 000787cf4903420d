"""Registry datasets fetched with git into the cache (`$HEMRA_CACHE_DIR`, else ~/.cache/hemra).

- `git/<url hash>-<commit>/`: a bare repository holding one commit of one git URL, fetched once
  (shallow, by commit id; the whole repository when the server refuses that).
- `datasets/<name>/<version>-<entry hash>/`: the dataset, one folder per task named after the
  task, plus `.hemra-dataset.json` (where it came from, when). The entry hash covers the
  registry's task list, so a registry that moves a version to other commits gets a new folder.

Both are built in a temporary folder beside their place and renamed into it, which is atomic:
a runner sees a complete folder or none, and when two runners fetch the same thing at once the
first rename wins and the other's copy is removed. A folder in place is used as it is, without
git or the network.

Files are written as committed (git's blobs, byte for byte: no line-ending conversion, filters
or export rules), so a dataset's digest is the same on every machine and equals the digest of
the same task folders kept locally.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pytest_hemra.core.cache import cache_root
from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.registry import RegistryDataset, RegistryTask, repository_path

MANIFEST = ".hemra-dataset.json"
MANIFEST_SCHEMA_VERSION = 1
FETCH_TIMEOUT_SECS = 900
LOCAL_GIT_TIMEOUT_SECS = 300
BUILDING_PREFIX = ".building-"
# no prompt for credentials (a run never waits on a terminal); no transport that runs commands
GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": "file:git:http:https:ssh"}
CHUNK = 1 << 20
ALL_REFS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
REGULAR, EXECUTABLE, LINK = "100644", "100755", "120000"


@dataclass(frozen=True)
class CachedDataset:
    """One registry dataset in the cache, as `hemra datasets` lists it."""

    name: str
    version: str
    tasks: int | None  # None: its record is missing or unreadable
    fetched_at: str | None
    size_bytes: int
    path: Path
    registry: str | None


def datasets_dir() -> Path:
    return cache_root() / "datasets"


def repositories_dir() -> Path:
    return cache_root() / "git"


def fetch_dataset(dataset: RegistryDataset, registry: str) -> Path:
    """The dataset's folder in the cache; its tasks are fetched first when it is not there."""
    folder = datasets_dir() / dataset.name / f"{dataset.version}-{entry_hash(dataset)}"
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with building_folder(folder.parent) as building:
        for index, task in enumerate(dataset.tasks):
            where = f"{registry}: {dataset.ref}: key 'tasks[{index}]"
            repository = fetch_commit(task, where)
            write_task(repository, task, building / task.name, where)
        manifest = {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "name": dataset.name,
            "version": dataset.version,
            "description": dataset.description,
            "registry": registry,
            "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tasks": [task.model_dump() for task in dataset.tasks],
        }
        (building / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        publish(building, folder)
    return folder


def entry_hash(dataset: RegistryDataset) -> str:
    tasks = [task.model_dump() for task in dataset.tasks]
    return hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()[:12]


def fetch_commit(task: RegistryTask, where: str) -> Path:
    """A bare repository in the cache holding `task.git_commit_id` of `task.git_url`."""
    url, commit = task.git_url, task.git_commit_id
    url_hash = hashlib.sha256(url.encode()).hexdigest()[:16]
    folder = repositories_dir() / f"{url_hash}-{commit}"
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with building_folder(folder.parent) as building:
        _git_checked(["init", "--quiet", "--bare", str(building)], where)
        fetched = _git(
            ["fetch", "--quiet", "--depth", "1", "--no-tags", url, commit],
            where,
            building,
            timeout=FETCH_TIMEOUT_SECS,
        )
        if fetched.returncode != 0 or not has_commit(building, commit, where):
            everything = _git(
                ["fetch", "--quiet", "--no-tags", url, *ALL_REFS],
                where,
                building,
                timeout=FETCH_TIMEOUT_SECS,
            )
            if everything.returncode != 0:
                raise SpecError(
                    f"{where}.git_url': cannot fetch {url} ({git_message(everything.stderr)})"
                )
            if not has_commit(building, commit, where):
                raise SpecError(f"{where}.git_commit_id': commit {commit} does not exist in {url}")
        # a ref keeps the commit's objects from ever being pruned as unreachable
        _git_checked(["update-ref", "refs/hemra/pinned", f"{commit}^{{commit}}"], where, building)
        publish(building, folder)
    return folder


def has_commit(repository: Path, commit: str, where: str) -> bool:
    found = _git(["cat-file", "-e", f"{commit}^{{commit}}"], where, repository)
    return found.returncode == 0


def write_task(repository: Path, task: RegistryTask, destination: Path, where: str) -> None:
    """Write the folder `task.path` at the task's commit to `destination`, blob by blob."""
    inside = repository_path(task, f"{where}.path'")
    commit = task.git_commit_id
    tree = f"{commit}:{inside}" if inside else f"{commit}^{{tree}}"
    kind = _git(["cat-file", "-t", tree], where, repository)
    if kind.returncode != 0:
        raise SpecError(
            f"{where}.path': {task.path!r} does not exist at commit {commit} of {task.git_url}"
        )
    if kind.stdout.strip() != "tree":
        found = "file" if kind.stdout.strip() == "blob" else kind.stdout.strip()
        raise SpecError(
            f"{where}.path': {task.path!r} is a {found}, not a folder, at commit {commit} of"
            f" {task.git_url}"
        )
    listing = _git(["ls-tree", "-r", "-z", tree], where, repository)
    entries = []  # (mode, object id, path inside the task folder)
    for line in filter(None, listing.stdout.split("\0")):
        header, _, path = line.partition("\t")
        mode, kind_name, object_id = header.split()
        if kind_name != "blob":
            raise SpecError(
                f"{where}.path': {task.path}/{path} is a {kind_name} (a submodule), which HEMRA"
                " does not fetch (expected the task's files in the repository itself)"
            )
        parts = path.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise SpecError(f"{where}.path': {task.path}/{path} is not a path inside the task")
        entries.append((mode, object_id, path))
    destination.mkdir(parents=True)
    with tempfile.TemporaryFile() as blobs:
        wanted = "".join(f"{object_id}\n" for _, object_id, _ in entries).encode()
        _git_to_file(["cat-file", "--batch"], wanted, blobs, where, repository)
        blobs.seek(0)
        for mode, object_id, path in entries:
            target = destination / path
            if _passes_a_link(destination, path):
                raise SpecError(f"{where}.path': {task.path}/{path} is inside a link")
            target.parent.mkdir(parents=True, exist_ok=True)
            batch_line = blobs.readline().decode().split()  # "<id> <type> <size>"
            if len(batch_line) != 3 or batch_line[0] != object_id:
                raise SpecError(f"{where}.path': git could not read {task.path}/{path}")
            size = int(batch_line[2])
            try:
                if mode == LINK:
                    os.symlink(blobs.read(size).decode(), target)
                else:
                    with open(target, "xb") as out:
                        _copy(blobs, out, size)
                    target.chmod(0o755 if mode == EXECUTABLE else 0o644)
            except FileExistsError:
                raise SpecError(f"{where}.path': {task.path}/{path} is there twice") from None
            blobs.read(1)  # the newline after each object


def publish(building: Path, folder: Path) -> None:
    """Rename a complete folder into place; when another runner got there first, keep theirs
    (`building_folder` removes ours)."""
    building.chmod(0o755)  # mkdtemp's 0700 is for the folder while it is being built
    try:
        building.rename(folder)
    except OSError:
        if not folder.is_dir():
            raise


@contextmanager
def building_folder(parent: Path) -> Iterator[Path]:
    """A temporary folder in `parent` (so renaming it into place is atomic), removed at exit
    unless it was renamed."""
    building = Path(tempfile.mkdtemp(prefix=BUILDING_PREFIX, dir=parent))
    try:
        yield building
    finally:
        shutil.rmtree(building, ignore_errors=True)


def cached_datasets() -> list[CachedDataset]:
    """Every registry dataset in the cache, by name and version."""
    found = []
    root = datasets_dir()
    for folder in sorted(root.glob("*/*")):
        if not folder.is_dir() or folder.name.startswith(BUILDING_PREFIX):
            continue
        manifest = _read_manifest(folder / MANIFEST)
        tasks = manifest.get("tasks")
        found.append(
            CachedDataset(
                name=str(manifest.get("name", folder.parent.name)),
                version=str(manifest.get("version", folder.name)),
                tasks=len(tasks) if isinstance(tasks, list) else None,
                fetched_at=manifest.get("fetched_at"),
                size_bytes=folder_size(folder),
                path=folder,
                registry=manifest.get("registry"),
            )
        )
    return found


def folder_size(folder: Path) -> int:
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            total += os.lstat(os.path.join(parent, name)).st_size
    return total


def git_message(stderr: str) -> str:
    """git's first `fatal:` or `error:` line (what went wrong, before its advice), in one line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        for prefix in ("fatal: ", "error: "):
            if line.startswith(prefix):
                return line.removeprefix(prefix)
    return lines[-1] if lines else "no message from git"


def _passes_a_link(destination: Path, path: str) -> bool:
    """Whether a folder on the way to `path` is a link (written so far), which a file must
    never be written through."""
    folder = destination
    for part in path.split("/")[:-1]:
        folder = folder / part
        if folder.is_symlink():
            return True
    return False


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _copy(source: IO[bytes], out: IO[bytes], size: int) -> None:
    left = size
    while left:
        chunk = source.read(min(CHUNK, left))
        if not chunk:
            raise OSError("git's output ended early")
        out.write(chunk)
        left -= len(chunk)


def _git(
    args: list[str],
    where: str,
    repository: Path | None = None,
    timeout: float = LOCAL_GIT_TIMEOUT_SECS,
) -> subprocess.CompletedProcess[str]:
    command = ["git", *(["--git-dir", str(repository)] if repository else []), *args]
    try:
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **GIT_ENV},
            check=False,
        )
    except FileNotFoundError:
        raise SpecError(f"{where}': git is not installed (it fetches registry datasets)") from None
    except subprocess.TimeoutExpired:
        raise SpecError(f"{where}': git {args[0]} took longer than {timeout:.0f} s") from None


def _git_checked(args: list[str], where: str, repository: Path | None = None) -> None:
    done = _git(args, where, repository)
    if done.returncode != 0:
        raise SpecError(f"{where}': git {args[0]} failed ({git_message(done.stderr)})")


def _git_to_file(
    args: list[str], stdin: bytes, out: IO[bytes], where: str, repository: Path
) -> None:
    try:
        done = subprocess.run(
            ["git", "--git-dir", str(repository), *args],
            input=stdin,
            stdout=out,
            stderr=subprocess.PIPE,
            timeout=LOCAL_GIT_TIMEOUT_SECS,
            env={**os.environ, **GIT_ENV},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SpecError(f"{where}': git {args[0]} took longer than the limit") from None
    if done.returncode != 0:
        raise SpecError(f"{where}': git {args[0]} failed ({git_message(done.stderr.decode())})")
