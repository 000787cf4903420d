"""Task images are built (or found cached) at resolve, before anything is recorded: a failing
build refuses the run in one line; a dry run and `--collect-only` build nothing. Real Docker,
real pytest sessions; every Dockerfile carries a fresh marker so no image is cached before."""

from __future__ import annotations

import re
import secrets
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from conftest import BASE_IMAGE, TaskMaker
from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.spec import load_run_spec
from pytest_hemra.store import Store

pytestmark = pytest.mark.usefixtures("docker_test")


def fresh_dockerfile(*steps: str) -> str:
    """A Dockerfile no earlier build made: its first step echoes a marker of its own."""
    lines = [f"FROM {BASE_IMAGE}", f"RUN echo {secrets.token_hex(8)}", *steps]
    return "\n".join(lines) + "\n"


def task_images(client: Any, task: str) -> list[Any]:
    """The task images built for a task of this name (`hemra.task` label, `hemra-task` tag)."""
    found = client.images.list(filters={"label": f"hemra.task={task}"})
    return [i for i in found if any(t.startswith("hemra-task:") for t in i.tags)]


def created(image: Any) -> float:
    """When Docker made the image, in seconds since the epoch."""
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", image.attrs["Created"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def test_a_task_image_that_fails_to_build_refuses_the_run_naming_it_and_records_nothing(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, docker_client: Any
) -> None:
    good = f"good-{secrets.token_hex(4)}"
    make_task(good, dockerfile=fresh_dockerfile())
    make_task(
        "broken",
        dockerfile=fresh_dockerfile("RUN echo 'E: Unable to locate package left-pad' >&2; exit 3"),
    )
    make_task("broken-too", dockerfile=fresh_dockerfile("RUN exit 4"))
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    store_path = tmp_path / "s.db"
    Store(store_path).close()  # a store that exists: the refused run adds nothing to it

    result = pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store_path))

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    (error,) = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert re.fullmatch(
        r"ERROR: \S+/ds/broken: image build failed: The command .* returned a non-zero code: 3"
        r" \(.*E: Unable to locate package left-pad\); 1 more failed: \S+/ds/broken-too",
        error,
    ), error
    assert "Removing intermediate container" not in error and "\x1b" not in error
    store = Store(store_path)
    assert store.runs() == []
    store.close()
    assert task_images(docker_client, good)  # every build was waited for: this one is cached


def test_a_task_image_missing_from_the_engine_refuses_the_run_at_resolve(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task(
        "named",
        dockerfile=None,
        task_toml='[environment]\ndocker_image = "hemra-test/not-here:never"\n',
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["nop"]\ndatasets = ["ds"]\n')

    result = pytester.runpytest("--hemra-run", str(run_file))

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: */ds/named: image 'hemra-test/not-here:never' is not on this docker engine"]
    )
    assert not (pytester.path / ".hemra").exists()


def test_every_task_image_is_built_at_resolve_several_at_once_before_any_trial(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, docker_client: Any
) -> None:
    names = [f"slow-build-{n}-{secrets.token_hex(4)}" for n in (1, 2)]
    for name in names:
        make_task(name, dockerfile=fresh_dockerfile("RUN sleep 4"))
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')

    result = pytester.runpytest("--hemra-run", str(run_file))

    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["hemra: building 2 task images (2 at once)"])
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    trials = [store.trial_detail(t.id) for t in store.trials(run.id)]
    store.close()
    built = [created(image) for name in names for image in task_images(docker_client, name)]
    assert len(built) == 2
    assert max(built) < run.created_at  # both built before the run was recorded
    assert max(built) < min(t.started_at for t in trials)
    assert abs(built[0] - built[1]) < 3  # at once: one after the other is 4 s apart at least
    # no trial built its image (a build takes 4 s at least): its phase is the engine's answer
    # that the image is there, slow only when the engine is busy (up to a second under load)
    assert all(t.phases["image"] < 2.5 for t in trials), [t.phases for t in trials]


def test_a_dry_run_lists_images_to_build_and_cached_ones_and_builds_nothing(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, docker_client: Any
) -> None:
    make_task("fresh", dockerfile=fresh_dockerfile())
    make_task("named", dockerfile=None, task_toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n[sandbox]\nimage_builds = 3\n')

    result = pytester.run("hemra", "run", str(run_file), "--dry-run")

    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(
        [
            "images to build: 1 (3 at once)",
            f"  hemra-task:* (from {tmp_path}/datasets/ds/fresh/environment)",
            "images cached: 1",
            f"  {BASE_IMAGE} (for {tmp_path}/datasets/ds/named)",
        ]
    )
    (tag,) = re.findall(r"hemra-task:[0-9a-f]+", result.stdout.str())
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)

    collected = pytester.runpytest("--hemra-run", str(run_file), "--collect-only", "-q")

    assert collected.ret == pytest.ExitCode.OK
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)
    assert not (pytester.path / ".hemra").exists()


def test_image_builds_at_once_is_at_least_one(tmp_path: Path) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        textwrap.dedent("""\
        harnesses = ["oracle"]
        datasets = ["ds"]
        [sandbox]
        image_builds = 0
    """)
    )
    with pytest.raises(SpecError, match=r"run.toml: key 'sandbox.image_builds': .*1"):
        load_run_spec(run_file, Overrides())
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    assert load_run_spec(run_file, Overrides()).sandbox.image_builds == 2


def test_an_image_user_that_is_not_a_user_refuses_the_run_naming_the_task(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    """The image's USER goes into the sandbox layer's LABEL line: anything but a user name or
    uid (here one with a space: Docker keeps it, and no user is named so) is refused."""
    make_task("odd-user", dockerfile=fresh_dockerfile('USER app" hemra.sandbox-layer="0'))
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: */ds/odd-user: image *: USER 'app hemra*' is not a user*"])
    assert not (pytester.path / ".hemra").exists()
