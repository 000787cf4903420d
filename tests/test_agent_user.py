"""Whose user the agent runs as, and the image's ENTRYPOINT kept, as Harbor runs a task."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import BASE_IMAGE, TaskMaker
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.report.fairness import dataset_flags

# the solution builds a tiny Debian package and installs it: only root can (dpkg's database)
INSTALL = """set -e
mkdir -p /tmp/pkg/DEBIAN
printf 'Package: hemra-demo\\nVersion: 1.0\\nArchitecture: all\\n' > /tmp/pkg/DEBIAN/control
printf 'Maintainer: x <x@x>\\nDescription: d\\n' >> /tmp/pkg/DEBIAN/control
dpkg-deb --build /tmp/pkg /tmp/hemra-demo.deb >/dev/null
dpkg -i /tmp/hemra-demo.deb
id -u > /app/uid.txt"""
INSTALLED = (
    "if dpkg -s hemra-demo >/dev/null 2>&1; then echo 1; else echo 0; fi"
    " > /logs/verifier/reward.txt"
)
ENTRY_IMAGE = f"""FROM {BASE_IMAGE}
RUN useradd -m -u 1234 app && mkdir /srv/state \\
 && printf '#!/bin/sh\\necho "token-$$" > /srv/state/token\\n\
echo start >> /srv/state/starts\\nexec "$@"\\n' > /entry.sh \\
 && chmod 755 /entry.sh
USER app
WORKDIR /app
ENTRYPOINT ["/entry.sh"]
"""


def trials(folder: Path) -> dict[str, dict[str, Any]]:
    connection = sqlite3.connect(folder / ".hemra" / "hemra.db")
    connection.row_factory = sqlite3.Row
    found = {r["item_id"]: dict(r) for r in connection.execute("SELECT * FROM trials")}
    connection.close()
    for row in found.values():
        row["result"] = json.loads((Path(row["trial_dir"]) / "result.json").read_text())
    return found


@pytest.mark.usefixtures("docker_test")
@pytest.mark.parametrize(("mode", "expected"), [("task", 1.0), ("non-root", 0.0)])
def test_a_root_task_installs_a_package_only_when_the_agent_runs_as_the_tasks_user(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, mode: str, expected: float
) -> None:
    root_image = f"FROM {BASE_IMAGE}\nWORKDIR /app\n"  # no USER: root is the task's user
    make_task("install", solve=INSTALL, test=INSTALLED, dockerfile=root_image)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'harnesses = ["oracle"]\ndatasets = ["ds"]\n[sandbox]\nagent_user = "{mode}"\n'
    )
    result = pytester.runpytest("--hemra-run", str(run_file))
    (row,) = trials(pytester.path).values()
    assert row["reward"] == expected, row["error"]
    user = "0:0 (root, image)" if mode == "task" else "1000:1000 (hemra)"
    assert row["result"]["agent_user"] == row["agent_user"] == user  # result.json and store
    shown = pytester.run("hemra", "show", row["id"])  # the store of the folder the run was in
    assert f"agent user {user}" in shown.stdout.str()
    flagged = "*! agents ran as root in 1 of 1 trial *"
    if mode == "task":  # the report says the agent ran as root
        result.stdout.fnmatch_lines([flagged])
    else:
        result.stdout.no_fnmatch_line(flagged)


def test_agents_of_one_task_run_as_different_users_are_flagged() -> None:
    def trial(harness: str, task: str, user: str) -> TrialRecord:
        return TrialRecord(
            id=f"r.{harness}{task}", run_id="r", seq=0, item_id=f"ds::{task}[{harness}-1]",
            dataset="ds", task=task, harness=harness, attempt=1, status="finished",
            outcome=Outcome.PASS, reward=1.0, rewards={}, error=None, duration=1.0,
            trial_dir=None, agent_user=user,
        )  # fmt: skip

    root, hemra = "0:0 (root, image)", "1000:1000 (hemra)"
    same = [trial("a", "t1", root), trial("b", "t1", root), trial("a", "t2", hemra)]
    assert [f.kind for f in dataset_flags(same, ["a", "b"], None)] == ["task_set", "agent_root"]
    mixed = [*same, trial("b", "t2", root)]
    flags = {f.kind: f.message for f in dataset_flags(mixed, ["a", "b"], None)}
    assert "on 1 task (e.g. t2: a as 1000:1000, b as 0:0)" in flags["agent_user_differs"]
    assert flags["agent_root"].startswith("agents ran as root in 3 of 4 trials")
    neither = [trial("a", "t1", hemra), trial("b", "t1", hemra)]
    assert dataset_flags(neither, ["a", "b"], None) == []


@pytest.mark.usefixtures("docker_test")
def test_the_images_entrypoint_runs_and_its_user_is_the_agents(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    """The image's ENTRYPOINT leaves a token the agent must hand back; its USER (uid 1234) is
    the agent's, which owns the work folder; the clean room still empties what the agent left
    running (killed by the kernel as the agent's user, and seen gone by the engine), while the
    entrypoint, root's, runs once, as Harbor runs it: its state is what the agent saw."""
    make_task(
        "entry",
        dockerfile=ENTRY_IMAGE,
        solve="cp /srv/state/token /app/answer.txt; id -u >> /app/answer.txt; (setsid sleep 300 &)",
        test='[ "$(head -1 /app/answer.txt)" = "$(cat /srv/state/token)" ] '
        '&& [ "$(wc -l < /srv/state/starts)" = 1 ] '
        '&& [ -z "$(find /proc -maxdepth 1 -user 1234 -name "[0-9]*")" ] '
        '&& [ "$(sed -n 2p /app/answer.txt)" = 1234 ] && echo 1 > /logs/verifier/reward.txt '
        "|| echo 0 > /logs/verifier/reward.txt",
        # the verifier as root (the image's USER would be Harbor's choice): it looks for
        # processes of the agent's uid, which a verifier of that uid would itself be
        task_toml="[environment.healthcheck]\ncommand = 'test -s /srv/state/token'\n"
        'interval_sec = 0.2\n[verifier]\nuser = "root"\n',
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle", "nop"]\ndatasets = ["ds"]\n[sandbox]\nagent_user = "task"\n'
    )
    pytester.runpytest("--hemra-run", str(run_file))
    found = trials(pytester.path)
    oracle, nop = found["ds::entry[oracle-1]"], found["ds::entry[nop-1]"]
    assert (oracle["outcome"], oracle["reward"]) == ("pass", 1.0), oracle["error"]
    assert (nop["outcome"], nop["reward"]) == ("fail", 0.0), nop["error"]
    assert oracle["result"]["agent_user"] == "1234:1234 (image)"


def test_a_task_user_must_be_a_name_or_uid(make_task: TaskMaker) -> None:
    from pytest_hemra.core.errors import SpecError
    from pytest_hemra.resolve.datasets import load_task

    with pytest.raises(SpecError, match=r"key 'agent.user': expected a user name or uid"):
        load_task(make_task("bad-user", task_toml='[agent]\nuser = "a b"\n'))


@pytest.mark.usefixtures("docker_test")
def test_a_tasks_skills_are_copied_where_the_harness_loads_them(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, write_harness: Any
) -> None:
    make_task(
        "skilled",
        dockerfile=f"FROM {BASE_IMAGE}\nWORKDIR /app\n"
        "RUN mkdir -p /opt/skills/greet && echo 'Say hi.' > /opt/skills/greet/SKILL.md\n",
        task_toml='[environment]\nskills_dir = "/opt/skills"\n',
        test='[ "$(cat /app/out.txt)" = "Say hi." ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt",
    )
    write_harness(
        "skilled",
        'kind = "program"\nskills_dir = "{home}/.agent/skills"\n'
        'command = ["sh", "-c", "cat $HOME/.agent/skills/greet/SKILL.md > /app/out.txt"]\n',
    )
    write_harness("unskilled", 'kind = "program"\nprovider = "anthropic"\ncommand = ["true"]\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["skilled", "unskilled"]\nmodel = "hemra/scripted"\ndatasets = ["ds"]\n'
    )
    result = pytester.runpytest("--hemra-run", str(run_file))
    result.stdout.fnmatch_lines(
        ["*harness 'unskilled' is not handed skills (no skills_dir*: skilled*"]
    )
    found = trials(pytester.path)
    assert found["ds::skilled[skilled-1]"]["reward"] == 1.0
    assert found["ds::skilled[unskilled-1]"]["reward"] == 0.0
