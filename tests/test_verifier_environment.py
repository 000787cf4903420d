"""`[verifier.environment]` as Harbor 0.26 defines it: the separate room's own environment, its
image built from tests/ (the bundled `harbor-features/verifier-environment` runs it for real in
tests/test_harbor_features.py); what HEMRA cannot build is refused at resolve, by file and key."""

from __future__ import annotations

import pytest

from conftest import TaskMaker
from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import bundled_dir, load_task
from pytest_hemra.resolve.verifier_environment import check_verifier_environment, verifier_task

OWN = '[verifier.environment]\ncpus = 1\nenv = { X = "y" }\n'


def test_a_verifier_environment_implies_the_separate_room_and_builds_from_tests() -> None:
    task = load_task(bundled_dir("datasets") / "harbor-features" / "verifier-environment")
    assert task.config.verifier.environment_mode == "separate"
    room = verifier_task(task)
    assert room is not None and room.environment_dir == task.path / "tests"
    assert room.has_dockerfile and room.config.environment.env == {"VERIFIER_FLAVOUR": "own"}
    assert room.environment_digest() != task.environment_digest()
    check_verifier_environment(task)
    plain = load_task(bundled_dir("datasets") / "harbor-features" / "workdir")
    assert verifier_task(plain) is None and plain.config.verifier.environment_mode is None


def test_shared_with_a_verifier_environment_is_refused_as_harbor_refuses_it(
    make_task: TaskMaker,
) -> None:
    folder = make_task("shared", task_toml='[verifier]\nenvironment_mode = "shared"\n' + OWN)
    with pytest.raises(SpecError, match="environment_mode = 'shared' with a"):
        load_task(folder)


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (OWN, "key 'verifier.environment': expected tests/Dockerfile"),
        (
            '[[steps]]\nname = "one"\n[steps.verifier.environment]\ncpus = 1\n',
            "key 'steps.verifier.environment' (step 'one')",
        ),
    ],
)
def test_a_verifier_environment_hemra_cannot_build_is_refused_naming_its_key(
    make_task: TaskMaker, toml: str, expected: str
) -> None:
    folder = make_task("own", task_toml=toml)
    if "steps" in toml:
        step = folder / "steps" / "one"
        for part in ("tests", "solution"):
            (step / part).mkdir(parents=True)
        (step / "instruction.md").write_text("Step one.")
        (step / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
        (step / "solution" / "solve.sh").write_text("true\n")
    with pytest.raises(SpecError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        check_verifier_environment(load_task(folder))
