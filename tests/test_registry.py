"""Datasets from a registry file (Harbor's format): `name@version` fetched with git into the cache.

Every repository here is a real git repository made in tmp_path and fetched over `file://`; the
registry is a JSON file named by HEMRA_REGISTRY; the cache is HEMRA_CACHE_DIR in tmp_path.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TaskMaker
from pytest_hemra.cli import main
from pytest_hemra.resolve.cache import fetch_dataset
from pytest_hemra.resolve.datasets import resolve_dataset
from pytest_hemra.resolve.registry import read_registry

OFFLINE = REPO / "datasets" / "hemra-offline"
TASKS = ("create-file", "fix-test")


@dataclass(frozen=True)
class TaskRepository:
    path: Path
    url: str
    commit: str


def git(*args: str, cwd: Path) -> str:
    identity = ["-c", "user.name=HEMRA tests", "-c", "user.email=tests@hemra.invalid"]
    done = subprocess.run(
        ["git", *identity, *args], cwd=cwd, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("HEMRA_CACHE_DIR", str(folder))
    monkeypatch.delenv("HEMRA_REGISTRY", raising=False)
    return folder


@pytest.fixture
def repository(tmp_path: Path) -> TaskRepository:
    """A git repository holding two bundled hemra-offline tasks under tasks/, one commit."""
    path = tmp_path / "tasks-repo"
    for task in TASKS:
        shutil.copytree(
            OFFLINE / task, path / "tasks" / task, ignore=shutil.ignore_patterns("__pycache__")
        )
    git("init", "--quiet", cwd=path)
    git("add", "--all", cwd=path)
    git("commit", "--quiet", "-m", "two tasks", cwd=path)
    return TaskRepository(path, path.as_uri(), git("rev-parse", "HEAD", cwd=path))


def entry(
    repository: TaskRepository, name: str = "offline", version: str = "1.0", **task: Any
) -> dict[str, Any]:
    """A registry dataset of TASKS from `repository`; `task` changes the first task's keys."""
    tasks = [
        {
            "name": t,
            "git_url": repository.url,
            "git_commit_id": repository.commit,
            "path": f"tasks/{t}",
        }
        for t in TASKS
    ]
    tasks[0].update(task)
    return {"name": name, "version": version, "description": "two offline tasks", "tasks": tasks}


WriteRegistry = Callable[[Any], Path]


@pytest.fixture
def write_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WriteRegistry:
    """Write `content` (JSON, or text as is) to registry.json and point HEMRA_REGISTRY at it."""

    def write(content: Any) -> Path:
        path = tmp_path / "registry.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        monkeypatch.setenv("HEMRA_REGISTRY", str(path))
        return path

    return write


def local_digest(tmp_path: Path) -> str:
    return resolve_dataset("hemra-offline", tmp_path, "run.toml", list(TASKS), []).digest


def test_a_registry_dataset_has_the_digest_of_the_same_task_folders_kept_locally(
    tmp_path: Path, repository: TaskRepository, write_registry: WriteRegistry, cache: Path
) -> None:
    write_registry([entry(repository)])

    dataset = resolve_dataset("offline@1.0", tmp_path, "run.toml", [], [])

    assert dataset.name == "offline"
    assert [task.name for task in dataset.tasks] == list(TASKS)
    assert cache / "datasets" / "offline" in dataset.path.parents
    assert dataset.digest == local_digest(tmp_path)
    solve = dataset.path / "create-file" / "solution" / "solve.sh"
    assert solve.read_bytes() == (OFFLINE / "create-file" / "solution" / "solve.sh").read_bytes()


def test_a_commit_given_by_a_prefix_is_fetched_whole_and_gives_the_same_digest(
    tmp_path: Path, repository: TaskRepository, write_registry: WriteRegistry
) -> None:
    short = entry(repository)
    for task in short["tasks"]:
        task["git_commit_id"] = repository.commit[:10]  # no server serves a prefix: a full fetch
    write_registry([short])

    assert resolve_dataset("offline@1.0", tmp_path, "x", [], []).digest == local_digest(tmp_path)


def test_a_second_resolution_uses_the_cache_without_the_repository_or_git(
    tmp_path: Path,
    repository: TaskRepository,
    write_registry: WriteRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_registry([entry(repository)])
    first = resolve_dataset("offline@1.0", tmp_path, "run.toml", [], [])
    local = resolve_dataset("hemra-offline", tmp_path, "run.toml", ["fix-test"], [])
    shutil.rmtree(repository.path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))  # a fetch would fail: no git

    again = resolve_dataset("offline@1.0", tmp_path, "run.toml", ["fix-test"], [])

    assert again.path == first.path
    assert [task.name for task in again.tasks] == ["fix-test"]
    assert again.digest == local.digest


def test_runners_fetching_the_same_dataset_at_once_share_one_complete_folder(
    repository: TaskRepository, write_registry: WriteRegistry, cache: Path
) -> None:
    registry = read_registry(str(write_registry([entry(repository)])))
    (dataset,) = registry.datasets

    with ThreadPoolExecutor(4) as pool:
        folders = set(pool.map(lambda _: fetch_dataset(dataset, registry.location), range(4)))

    (folder,) = folders
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == list(TASKS)
    assert list(cache.rglob(".building-*")) == []
    assert len(list((cache / "git").iterdir())) == 1


def test_name_at_hex_is_a_local_pin_unless_the_registry_lists_that_version(
    tmp_path: Path, repository: TaskRepository, write_registry: WriteRegistry, make_task: TaskMaker
) -> None:
    make_task("hello", dataset="offline")
    local = resolve_dataset("offline", tmp_path, "run.toml", [], [])
    pin = f"offline@{local.digest[:8]}"
    assert resolve_dataset(pin, tmp_path, "run.toml", [], []).path == local.path  # no registry

    write_registry([entry(repository, version="1.0"), entry(repository, version="abcdef")])

    assert resolve_dataset(pin, tmp_path, "run.toml", [], []).path == local.path  # not listed
    listed = resolve_dataset("offline@abcdef", tmp_path, "run.toml", [], [])
    assert listed.path != local.path
    assert listed.digest == local_digest(tmp_path)  # the registry's tasks, not the local folder


def test_hemra_datasets_lists_the_registry_and_the_cache(
    tmp_path: Path,
    repository: TaskRepository,
    write_registry: WriteRegistry,
    capsys: pytest.CaptureFixture[str],
) -> None:
    other = entry(repository, name="other", version="2.1")
    other["tasks"] = other["tasks"][:1]
    registry = write_registry([entry(repository), other])
    assert main(["datasets"]) == 0
    before = capsys.readouterr().out
    assert f"registry: {registry}" in before
    assert "offline    1.0        2        two offline tasks" in before
    assert "other      2.1        1        two offline tasks" in before
    assert "no datasets fetched yet" in before

    fetched = resolve_dataset("offline@1.0", tmp_path, "run.toml", [], [])
    assert main(["datasets", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)

    assert listed["registry"] == str(registry)
    assert [(d["name"], d["version"], d["tasks"]) for d in listed["datasets"]] == [
        ("offline", "1.0", 2),
        ("other", "2.1", 1),
    ]
    (cached,) = listed["cache"]["datasets"]
    assert (cached["name"], cached["version"], cached["tasks"]) == ("offline", "1.0", 2)
    assert cached["path"] == str(fetched.path)
    assert cached["registry"] == str(registry)
    assert cached["fetched_at"].endswith("Z")
    assert cached["size_bytes"] > 1000
    assert listed["cache"]["git"]["repositories"] == 1
    assert main(["datasets"]) == 0
    table = capsys.readouterr().out
    assert "offline    1.0        2        20" in table  # fetched this century, at its size
    assert "git: 1 repositories" in table


def test_hemra_datasets_without_a_registry_still_lists_the_cache(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "registry: none (HEMRA_REGISTRY is not set" in out
    assert "no datasets fetched yet" in out


Case = Callable[[TaskRepository, WriteRegistry], str]  # sets up; returns the expected line


def no_registry(repository: TaskRepository, write_registry: WriteRegistry) -> str:
    return (
        "run.toml: key 'datasets': 'offline@1.0' names a registry dataset (name@version) but no"
        " registry is set (set HEMRA_REGISTRY to a registry file or URL"
    )


def registry_with(content: Any, expected: str) -> Case:
    def case(repository: TaskRepository, write_registry: WriteRegistry) -> str:
        made = content(repository) if callable(content) else content
        path = write_registry(made)
        found = {"url": repository.url, "path": repository.path, "commit": repository.commit}
        return f"{path}{expected.format(**found)}"

    return case


def missing_file(repository: TaskRepository, write_registry: WriteRegistry) -> str:
    path = write_registry([])
    path.unlink()
    return f"{path}: cannot read the registry (No such file or directory)"


def without(key: str) -> Callable[[TaskRepository], Any]:
    def made(repository: TaskRepository) -> Any:
        dataset = entry(repository)
        del dataset["tasks"][0][key]
        return [dataset]

    return made


def changed(**task: Any) -> Callable[[TaskRepository], Any]:
    return lambda repository: [entry(repository, **task)]


ABSENT_COMMIT = "0123456789abcdef0123456789abcdef01234567"
AT = ": offline@1.0: key 'tasks[0]"
ERRORS: dict[str, Case] = {
    "no-registry-set": no_registry,
    "registry-file-missing": missing_file,
    "not-json": registry_with("[{", ": not valid JSON"),
    "not-a-list": registry_with(
        {"name": "offline"}, ": expected a JSON list of datasets, got a JSON object"
    ),
    "missing-key": registry_with(
        without("git_commit_id"),
        ": dataset [0] (offline@1.0): key 'tasks[0].git_commit_id' is required",
    ),
    "unknown-key": registry_with(
        lambda r: [{**entry(r), "descripton": "typo"}],
        ": dataset [0] (offline@1.0): key 'descripton' is not a registry key"
        " (did you mean 'description'?)",
    ),
    "listed-twice": registry_with(
        lambda r: [entry(r), entry(r)],
        ": dataset [1] (offline@1.0): offline@1.0 is listed twice",
    ),
    "unknown-version": registry_with(
        lambda r: [entry(r), entry(r, version="2.0")],
        "",  # the run file's line names the registry after the entry, below
    ),
    "unknown-name": registry_with(lambda r: [entry(r, name="other")], ""),
    "commit-not-in-repository": registry_with(
        changed(git_commit_id=ABSENT_COMMIT),
        f"{AT}.git_commit_id': commit {ABSENT_COMMIT} does not exist in {{url}}",
    ),
    "moving-head": registry_with(
        changed(git_commit_id="head"),
        f"{AT}.git_commit_id': 'head' is not a commit id (expected 7 to 64 lowercase hex digits",
    ),
    "path-not-at-commit": registry_with(
        changed(path="tasks/nope"),
        f"{AT}.path': 'tasks/nope' does not exist at commit {{commit}} of {{url}}",
    ),
    "path-escapes": registry_with(
        changed(path="../outside"), f"{AT}.path': '../outside' leads out of the repository"
    ),
    "path-is-a-file": registry_with(
        changed(path="tasks/create-file/task.toml"),
        f"{AT}.path': 'tasks/create-file/task.toml' is a file, not a folder",
    ),
    "unreachable-repository": registry_with(
        lambda r: [entry(r, git_url=r.url + "-gone")],
        f"{AT}.git_url': cannot fetch {{url}}-gone ('{{path}}-gone' does not appear to be a git"
        " repository)",
    ),
}
RUN_REF = {"unknown-version": "offline@9.9", "unknown-name": "offline@1.0"}
RUN_LINE = {
    "unknown-version": "run.toml: key 'datasets': 'offline@9.9': {registry} lists no version"
    " '9.9' of 'offline' (its versions: 1.0, 2.0)",
    "unknown-name": "run.toml: key 'datasets': 'offline@1.0': {registry} lists no dataset named"
    " 'offline' (it lists: other)",
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_bad_registry_input_is_refused_in_one_line_and_nothing_is_recorded_or_cached(
    case: str,
    pytester: pytest.Pytester,
    tmp_path: Path,
    repository: TaskRepository,
    write_registry: WriteRegistry,
    cache: Path,
) -> None:
    expected = ERRORS[case](repository, write_registry)
    if case in RUN_LINE:
        expected = RUN_LINE[case].format(registry=tmp_path / "registry.json")
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'harnesses = ["oracle"]\ndatasets = ["{RUN_REF.get(case, "offline@1.0")}"]\n'
    )

    result = pytester.runpytest("--hemra-run", str(run_file))

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.errlines
    assert expected in errors[0]
    assert not (pytester.path / ".hemra").exists()
    assert not (cache / "datasets").exists() or not any((cache / "datasets").rglob("task.toml"))
    assert list(cache.rglob(".building-*")) == []


def test_a_flag_names_a_registry_dataset_as_the_run_file_does(
    pytester: pytest.Pytester,
    tmp_path: Path,
    repository: TaskRepository,
    write_registry: WriteRegistry,
) -> None:
    write_registry([entry(repository)])

    result = pytester.runpytest(
        "--hemra-harness", "oracle", "--hemra-dataset", "offline@1.0", "--collect-only", "-q"
    )

    result.stdout.fnmatch_lines(["offline::create-file[[]oracle-1[]]", "offline::fix-test*"])
    assert not (pytester.path / ".hemra").exists()


@pytest.mark.usefixtures("docker_test")
def test_oracle_passes_a_registry_task_and_the_run_records_its_digest(
    pytester: pytest.Pytester,
    tmp_path: Path,
    repository: TaskRepository,
    write_registry: WriteRegistry,
) -> None:
    write_registry([entry(repository)])
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        textwrap.dedent(
            """\
            harnesses = ["oracle"]
            datasets = ["offline@1.0"]
            tasks = ["create-file"]
            """
        )
    )
    store = tmp_path / "hemra.db"

    result = pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store))

    result.assert_outcomes(passed=1)
    digest = resolve_dataset("hemra-offline", tmp_path, "x", ["create-file"], []).digest
    result.stdout.fnmatch_lines([f"*offline@{digest[:12]}* (1 task)*"])
    connection = sqlite3.connect(store)
    (plan,) = connection.execute("SELECT spec FROM runs").fetchone()
    connection.close()
    recorded = json.loads(plan)["datasets"]["offline"]
    assert recorded["digest"] == digest
    assert recorded["tasks"] == ["create-file"]
    assert "/cache/datasets/offline/" in recorded["path"]


def test_the_registry_example_makes_a_registry_its_run_file_resolves(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = REPO / "examples" / "registry"
    subprocess.run(
        ["bash", str(example / "make-registry.sh"), str(tmp_path / "build")],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("HEMRA_REGISTRY", str(tmp_path / "build" / "registry.json"))

    result = pytester.runpytest("--hemra-run", str(example / "oracle-vs-nop.toml"), "--co", "-q")

    assert result.ret == 0, result.errlines
    result.stdout.fnmatch_lines(["hemra-offline-mini::create-file[[]nop-1[]]", "*4 tests*"])
    fetched = resolve_dataset("hemra-offline-mini@1.0", tmp_path, "x", [], [])
    assert fetched.digest == local_digest(tmp_path)


def test_the_registry_example_works_from_the_copy_hemra_init_writes(tmp_path: Path) -> None:
    """`hemra init --example registry` writes the example outside any clone: its script takes
    the installed package's bundled tasks, and makes the same commit a clone's copy makes."""
    subprocess.run(["hemra", "init", "--example", "registry"], cwd=tmp_path, check=True)
    copied = tmp_path / "examples" / "registry" / "make-registry.sh"
    assert not (tmp_path / "datasets").exists()
    made = {}
    for name, script in (("copy", copied), ("clone", REPO / "examples" / "registry" / copied.name)):
        subprocess.run(["bash", str(script), str(tmp_path / name)], check=True, capture_output=True)
        (listed,) = json.loads((tmp_path / name / "registry.json").read_text())
        made[name] = {task["git_commit_id"] for task in listed["tasks"]}
    assert made["copy"] == made["clone"] and len(made["copy"]) == 1
