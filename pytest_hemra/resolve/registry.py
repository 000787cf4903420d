"""The dataset registry: a JSON list of datasets in Harbor's format, named by `HEMRA_REGISTRY`.

Each dataset is `{"name", "version", "description", "tasks": [{"name", "git_url",
"git_commit_id", "path"}]}` (Harbor's optional `metrics` is accepted and not used: HEMRA scores
its own way). `HEMRA_REGISTRY` is a file path or a `file://`, `http://` or `https://` URL; unset,
there is no registry. `resolve/cache.py` fetches a listed dataset's tasks into the cache.

A dataset entry `name@version` is a registry dataset when the registry lists that name and
version. Otherwise a version of 6 to 64 lowercase hex digits is the pin of a local dataset's
digest (`resolve/datasets.py`), and anything else is refused naming the versions that exist.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.validation import describe_error, is_valid_name

REGISTRY_VARIABLE = "HEMRA_REGISTRY"
URL_SCHEMES = ("file", "http", "https")
READ_TIMEOUT_SECS = 60
MAX_REGISTRY_BYTES = 64 << 20
COMMIT_PATTERN = re.compile(r"^[0-9a-f]{7,64}$")
LISTED_NAMES = 12  # how many of the registry's names an unknown-name error shows


class RegistryTask(BaseModel):
    """One task of a registry dataset: the folder `path` of `git_url` at `git_commit_id`."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str
    git_url: str
    git_commit_id: str
    path: str


class RegistryDataset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str
    version: str
    description: str
    tasks: tuple[RegistryTask, ...]
    metrics: list[Any] = Field(default_factory=list)  # Harbor's; HEMRA's reports score instead

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class Registry:
    location: str  # the file's absolute path, or the URL
    datasets: tuple[RegistryDataset, ...]

    def find(self, name: str, version: str) -> RegistryDataset | None:
        return next((d for d in self.datasets if (d.name, d.version) == (name, version)), None)

    def versions(self, name: str) -> list[str]:
        return [d.version for d in self.datasets if d.name == name]


def configured_registry() -> str | None:
    """`HEMRA_REGISTRY` as set (a path or a URL), or None when it is unset or empty."""
    return os.environ.get(REGISTRY_VARIABLE) or None


def read_registry(location: str) -> Registry:
    """Read and check the whole registry at `location` (a path, or a URL fetched once)."""
    if "://" in location:
        scheme = urllib.parse.urlsplit(location).scheme
        if scheme not in URL_SCHEMES:
            raise SpecError(
                f"{REGISTRY_VARIABLE}={location}: expected a file path or a file://, http:// or"
                " https:// URL"
            )
        try:
            with urllib.request.urlopen(location, timeout=READ_TIMEOUT_SECS) as response:
                content: bytes = response.read(MAX_REGISTRY_BYTES + 1)
        except (OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise SpecError(f"{location}: cannot read the registry ({reason})") from None
    else:
        path = Path(location).expanduser().absolute()
        location = str(path)
        try:
            content = path.read_bytes()
        except OSError as error:
            raise SpecError(f"{location}: cannot read the registry ({error.strerror})") from None
    if len(content) > MAX_REGISTRY_BYTES:
        raise SpecError(f"{location}: larger than {MAX_REGISTRY_BYTES >> 20} MiB (not a registry)")
    return parse_registry(content, location)


def parse_registry(content: bytes, location: str) -> Registry:
    try:
        data = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SpecError(f"{location}: not valid JSON ({error})") from None
    if not isinstance(data, list):
        raise SpecError(
            f"{location}: expected a JSON list of datasets, got a JSON {_json_type(data)}"
        )
    datasets = []
    seen: set[tuple[str, str]] = set()
    for index, item in enumerate(data):
        where = f"{location}: dataset [{index}]"
        if not isinstance(item, dict):
            raise SpecError(f"{where}: expected a JSON object, got a JSON {_json_type(item)}")
        if isinstance(item.get("name"), str) and isinstance(item.get("version"), str):
            where += f" ({item['name']}@{item['version']})"
        try:
            dataset = RegistryDataset.model_validate(item)
        except ValidationError as error:
            raise SpecError(
                f"{where}: {describe_error(RegistryDataset, error, 'registry key')}"
            ) from None
        if (dataset.name, dataset.version) in seen:
            raise SpecError(f"{where}: {dataset.ref} is listed twice (expected each version once)")
        seen.add((dataset.name, dataset.version))
        datasets.append(dataset)
    return Registry(location, tuple(datasets))


def listed_dataset(ref: str, source: str, is_pin: bool) -> tuple[Registry, RegistryDataset] | None:
    """The registry dataset a run's entry `name@version` names, checked for fetching; None when
    the entry is a local dataset: a name, a path, or a pin (`is_pin`) the registry does not list."""
    name, at, version = ref.partition("@")
    if not at or not is_valid_name(name):
        return None
    where = f"{source}: key 'datasets': {ref!r}"
    location = configured_registry()
    if location is None:
        if is_pin:
            return None
        raise SpecError(
            f"{where} names a registry dataset (name@version) but no registry is set (set"
            f" {REGISTRY_VARIABLE} to a registry file or URL; a local dataset is pinned as"
            " name@<6 to 64 hex digits of its digest>)"
        )
    registry = read_registry(location)
    found = registry.find(name, version)
    if found is None:
        if is_pin:
            return None
        versions = registry.versions(name)
        if versions:
            raise SpecError(
                f"{where}: {registry.location} lists no version {version!r} of {name!r}"
                f" (its versions: {', '.join(versions)})"
            )
        names = list(dict.fromkeys(d.name for d in registry.datasets))
        listed = ", ".join(names[:LISTED_NAMES]) + (", ..." if len(names) > LISTED_NAMES else "")
        raise SpecError(
            f"{where}: {registry.location} lists no dataset named {name!r}"
            f" (it lists: {listed or 'nothing'})"
        )
    check_fetchable(found, registry.location)
    return registry, found


def check_fetchable(dataset: RegistryDataset, location: str) -> None:
    """What HEMRA needs to fetch a listed dataset beyond Harbor's format: names that can be
    folder names, tasks at pinned commits, paths inside their repositories."""
    where = f"{location}: {dataset.ref}"
    for key, value in (("name", dataset.name), ("version", dataset.version)):
        if not is_valid_name(value):
            raise SpecError(
                f"{where}: key '{key}': {value!r} is not a valid {key} (expected letters, digits,"
                " '.', '_' or '-' not starting with '.' or '-')"
            )
    if not dataset.tasks:
        raise SpecError(f"{where}: key 'tasks': empty (expected at least one task)")
    seen: set[str] = set()
    for index, task in enumerate(dataset.tasks):
        key = f"{where}: key 'tasks[{index}]"
        if not is_valid_name(task.name):
            raise SpecError(f"{key}.name': {task.name!r} is not a valid task name")
        if task.name in seen:
            raise SpecError(f"{key}.name': task {task.name!r} is listed twice")
        seen.add(task.name)
        if not task.git_url or task.git_url.startswith("-"):
            raise SpecError(f"{key}.git_url': {task.git_url!r} is not a git URL")
        if not COMMIT_PATTERN.match(task.git_commit_id):
            raise SpecError(
                f"{key}.git_commit_id': {task.git_commit_id!r} is not a commit id (expected 7 to"
                " 64 lowercase hex digits: HEMRA fetches tasks at a pinned commit)"
            )
        repository_path(task, f"{key}.path'")


def repository_path(task: RegistryTask, key: str) -> str:
    """The task's `path` as git names it inside the repository ('' for its root); a path that
    is absolute or climbs out with '..' is refused."""
    path = PurePosixPath(task.path)
    if path.is_absolute() or ".." in path.parts:
        raise SpecError(
            f"{key}: {task.path!r} leads out of the repository (expected a relative path to a"
            " folder inside it)"
        )
    return "/".join(part for part in path.parts if part != ".")


def _json_type(value: object) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")
