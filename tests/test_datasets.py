"""Dataset digests, pins and lookup: the same content gives the same digest on every machine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import TaskMaker
from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import find_dataset, resolve_dataset, tree_digest


def test_digest_depends_on_content_and_paths_only(tmp_path: Path, make_task: TaskMaker) -> None:
    task = make_task("one")
    dataset = task.parent
    first = resolve_dataset(str(dataset), tmp_path, "run.toml", [], []).digest
    copy = tmp_path / "elsewhere" / "ds"
    shutil.copytree(dataset, copy)
    (copy / "one" / "tests" / "__pycache__").mkdir()
    (copy / "one" / "tests" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    assert resolve_dataset(str(copy), tmp_path, "run.toml", [], []).digest == first
    (copy / "one" / "instruction.md").write_text("Something else.")
    assert resolve_dataset(str(copy), tmp_path, "run.toml", [], []).digest != first


def test_digest_covers_only_the_selected_tasks(tmp_path: Path, make_task: TaskMaker) -> None:
    make_task("one")
    dataset = make_task("two").parent
    both = resolve_dataset(str(dataset), tmp_path, "run.toml", [], [])
    one = resolve_dataset(str(dataset), tmp_path, "run.toml", ["one"], [])
    assert one.digest != both.digest
    assert one.digest == tree_digest(dataset, [dataset / "one"])
    assert [t.name for t in one.tasks] == ["one"]


def test_pin_by_digest_prefix(tmp_path: Path, make_task: TaskMaker) -> None:
    make_task("one")
    digest = resolve_dataset("ds", tmp_path, "run.toml", [], []).digest
    assert resolve_dataset(f"ds@{digest[:8]}", tmp_path, "run.toml", [], []).digest == digest
    with pytest.raises(SpecError, match=f"selected content has digest {digest}"):
        resolve_dataset(
            "ds@" + ("0" if digest[0] != "0" else "1") * 8, tmp_path, "run.toml", [], []
        )


def test_bundled_datasets_are_found_by_name(tmp_path: Path) -> None:
    found = find_dataset("hemra-offline", tmp_path, "x")
    assert found.name == "hemra-offline" and (found / "create-file" / "task.toml").is_file()
    offline = resolve_dataset("hemra-offline", tmp_path, "x", [], [])
    assert len(offline.tasks) >= 6
    assert len(resolve_dataset("text-tools", tmp_path, "x", [], []).tasks) >= 5


def test_datasets_path_variable_is_searched(
    tmp_path: Path, make_task: TaskMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_task("one", dataset="mine")
    monkeypatch.setenv("HEMRA_DATASETS_PATH", str(tmp_path / "datasets"))
    assert find_dataset("mine", tmp_path / "nowhere", "x") == tmp_path / "datasets" / "mine"


def test_task_timeouts_and_limits_are_read(tmp_path: Path, make_task: TaskMaker) -> None:
    make_task(
        "one",
        task_toml="""\
        [agent]
        timeout_sec = 12.5
        [verifier]
        timeout_sec = 7
        [environment]
        build_timeout_sec = 99
        cpus = 2
        memory_mb = 256
        [metadata]
        difficulty = "easy"
    """,
    )
    (task,) = resolve_dataset("ds", tmp_path, "x", [], []).tasks
    config = task.config
    assert (config.agent.timeout_sec, config.verifier.timeout_sec) == (12.5, 7.0)
    environment = config.environment
    assert (environment.build_timeout_sec, environment.cpus, environment.memory_mb) == (99, 2, 256)


def test_tasks_are_selected_by_name_before_any_is_read(
    tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("good")
    make_task("needs-gpu", task_toml="[environment]\ngpus = 1\n")
    (tmp_path / "datasets" / "ds" / "unreadable").mkdir()
    (tmp_path / "datasets" / "ds" / "unreadable" / "task.toml").write_text("not = [toml")
    with pytest.raises(SpecError, match=r"needs-gpu/task\.toml: key 'environment\.gpus'"):
        resolve_dataset("ds", tmp_path, "run.toml", [], [])
    kept = resolve_dataset("ds", tmp_path, "run.toml", [], ["needs-*", "unreadable"])
    assert [t.name for t in kept.tasks] == ["good"]
    assert kept.digest == tree_digest(tmp_path / "datasets" / "ds", [kept.tasks[0].path])
    assert [t.name for t in resolve_dataset("ds", tmp_path, "x", ["go*"], []).tasks] == ["good"]
