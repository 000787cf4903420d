"""Whose user the agent (and the verifier) runs as, and its home.

`[sandbox] agent_user = "task"` (the default): as Harbor runs a task, its `[agent] user`, else
the image's USER, else root. `"non-root"`: HEMRA's `agent` (uid 1000, home /home/agent),
unless the task's `[agent] user` names another user that is not root (a task asking for root
gets uid 1000 all the same). A user named by name is looked up in the sandbox (its uid, gid and
home), as root, before the agent's turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import AGENT_HOME, AGENT_USER, ROOT_USER, Sandbox
from pytest_hemra.resolve.datasets import Task

LOOKUP = """set -e
u=$(id -u "$1"); g=$(id -g "$1"); h=$(getent passwd "$u" | cut -d: -f6)
echo "$u:$g ${h:-/}"
"""
ROOT_NAMES = ("root", "0", "0:0")


@dataclass(frozen=True)
class Identity:
    user: str  # "uid:gid", as docker exec takes it
    home: str
    source: str  # "hemra" (uid 1000), "task" ([agent] user), "image" (its USER, or root)

    @property
    def is_root(self) -> bool:
        return self.user.split(":")[0] == "0"

    def describe(self) -> str:
        return f"{self.user} ({'root, ' if self.is_root else ''}{self.source})"


HEMRA_AGENT = Identity(AGENT_USER, AGENT_HOME, "hemra")


def agent_identity(task: Task, mode: str, sandbox: Sandbox, log: Path) -> Identity:
    """The agent's user for `task` under the run's `agent_user` mode (see the module)."""
    configured = task.config.agent.user
    if configured is not None:
        wanted, source = str(configured), "task"
    elif mode == "task":
        wanted, source = sandbox.image_user or "root", "image"
    else:
        return HEMRA_AGENT
    if wanted in ROOT_NAMES:
        return HEMRA_AGENT if mode == "non-root" else Identity(ROOT_USER, "/root", source)
    if wanted in (AGENT_USER, AGENT_USER.split(":")[0]):
        return Identity(AGENT_USER, AGENT_HOME, source)
    found = lookup(task, wanted, sandbox, log, source, "agent's")
    if found.is_root and mode == "non-root":
        return HEMRA_AGENT
    return found


def verifier_identity(
    task: Task, configured: str | int | None, sandbox: Sandbox, log: Path
) -> Identity:
    """The verifier's user, as Harbor runs it: `[verifier] user` (a step's, else the task's),
    else the image's USER, else root."""
    wanted, source = (
        (str(configured), "task")
        if configured is not None
        else (sandbox.image_user or "root", "image")
    )
    if wanted in ROOT_NAMES:
        return Identity(ROOT_USER, "/root", source)
    if wanted in (AGENT_USER, AGENT_USER.split(":")[0]):  # HEMRA's agent user, no lookup
        return Identity(AGENT_USER, AGENT_HOME, source)
    return lookup(task, wanted, sandbox, log, source, "verifier's")


def lookup(
    task: Task, wanted: str, sandbox: Sandbox, log: Path, source: str, whose: str
) -> Identity:
    """`wanted` (a name or uid, with an optional ":gid") as "uid:gid" and home, looked up in
    the sandbox as root; a uid the image does not name is taken as it is."""
    name = wanted.split(":")[0]
    result = sandbox.exec(
        ["sh", "-c", LOOKUP, "sh", name],
        user=ROOT_USER,
        env={},
        timeout=30,
        stdout=log,
        stderr=log,
        workdir="/",
    )
    found = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
    if (result.exit_code != 0 or not found) and name.isdigit():  # a uid the image does not name
        gid = wanted.split(":")[1] if ":" in wanted else name
        return Identity(f"{name}:{gid}", "/", source)
    if result.exit_code != 0 or not found or " " not in found[-1]:
        raise InfraError(
            f"{task.path / 'task.toml'}: the {whose} user {wanted!r} is not in the image"
        )
    ids, home = found[-1].split(" ", 1)
    uid, gid = ids.split(":")
    if ":" in wanted:
        gid = wanted.split(":")[1]
    return Identity(f"{uid}:{gid}", home, source)
