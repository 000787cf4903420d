"""Red team: the verifier's clean room. Harnesses that try to win without doing the task, by a
process left behind, a planted reward, a rewritten test.sh, tests read during a turn or a tool
replaced outside /app; each scores what an honest harness that does nothing scores."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import BASE_IMAGE, TaskMaker
from pytest_hemra.core.errors import SpecError
from pytest_hemra.execute.sandbox import AGENT_USER, ROOT_USER, Limits, SandboxRequest
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.execute.sandbox.processes import end_all_but_init
from pytest_hemra.resolve.datasets import load_task
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.spec import load_run_spec
from tests.redteam import run_harnesses

pytestmark = pytest.mark.usefixtures("docker_test")

SECRET = "answer-7c41"
# the answer is in the hidden tests alone; the verifier takes its time, as a real suite does,
# so a process still running could act while it runs
SLOW_TEST = (
    'sleep 3; if [ "$(cat /app/out.txt 2>/dev/null)" = "$(cat /tests/answer.txt)" ]; '
    "then echo 1; else echo 0; fi > /logs/verifier/reward.txt"
)
NOP = 'kind = "program"\ncommand = ["true"]\n'


def _daemon(loop: str) -> str:
    """A harness that leaves a re-parented daemon (setsid, nohup, double fork) running `loop`
    every 50 ms, starting once its own turn has ended, and exits at once."""
    script = f"sleep 1\nwhile :; do\n{loop}\nsleep 0.05\ndone\n"
    launch = '( setsid nohup sh -c "$0" >/dev/null 2>&1 & ); exit 0'
    return f'kind = "program"\ncommand = {json.dumps(["sh", "-c", launch, script])}\n'


ATTACKS = {
    "copies-the-tests-answers-into-app": _daemon(
        "cat /tests/answer.txt > /app/.a 2>/dev/null && mv /app/.a /app/out.txt"
    ),
    "rewrites-test-sh": _daemon(
        "printf 'echo 1 > /logs/verifier/reward.txt\\n' 2>/dev/null > /tests/test.sh"
    ),
    "plants-the-reward": _daemon(
        "echo 1 2>/dev/null > /logs/verifier/reward.txt\n"
        """echo '{"reward": 1}' 2>/dev/null > /logs/verifier/reward.json"""
    ),
    "writes-the-expected-answer-late": _daemon(f"echo {SECRET} > /app/out.txt"),
}


def _secret_task(make_task: TaskMaker, name: str = "secret", **options: Any) -> Path:
    folder = make_task(name, test=SLOW_TEST, solve=f"echo {SECRET} > /app/out.txt", **options)
    (folder / "tests" / "answer.txt").write_text(SECRET + "\n")
    return folder


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_process_left_behind_is_killed_before_the_tests_enter(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    attack: str,
) -> None:
    _secret_task(make_task)
    write_harness("nop", NOP)
    write_harness("attacker", ATTACKS[attack])
    rows = run_harnesses(pytester, tmp_path, ["nop", "attacker"])
    assert (rows["attacker"]["outcome"], rows["attacker"]["reward"]) == ("fail", 0.0)
    assert rows["attacker"]["reward"] == rows["nop"]["reward"]


def test_a_process_left_behind_by_an_agent_past_its_timeout_is_killed_too(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
) -> None:
    _secret_task(make_task, task_toml="[agent]\ntimeout_sec = 2\n")
    daemon = ATTACKS["copies-the-tests-answers-into-app"].replace("exit 0", "sleep 30")
    write_harness("attacker", daemon)
    rows = run_harnesses(pytester, tmp_path, ["attacker"])
    assert (rows["attacker"]["outcome"], rows["attacker"]["reward"]) == ("timeout", 0.0)


def test_a_reward_file_written_before_the_verifier_is_not_read(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
) -> None:
    """Every route a harness has to /logs/verifier before the verifier: its own command (the
    folder is root's) and its `[files]` (written as the agent's user: refused, or planted
    through a route that wrote as root, then emptied before test.sh)."""
    _secret_task(make_task)
    write_harness("nop", NOP)
    write_harness(
        "planter",
        """\
        kind = "program"
        command = ["bash", "-c", "echo 1 > /logs/verifier/reward.txt; mkdir /logs/verifier/x; true"]
        """,
    )
    write_harness(
        "file-planter",
        """\
        kind = "program"
        command = ["true"]
        [files]
        "/logs/verifier/reward.txt" = "1"
        "/logs/verifier/reward.json" = '{"reward": 1}'
        "/tests/test.sh" = "echo 1 > /logs/verifier/reward.txt"
        """,
    )
    rows = run_harnesses(pytester, tmp_path, ["nop", "planter", "file-planter"])
    assert (rows["planter"]["outcome"], rows["planter"]["reward"]) == ("fail", 0.0)
    assert rows["file-planter"]["outcome"] in ("fail", "harness_error")  # harness_error: refused
    assert rows["planter"]["reward"] == rows["file-planter"]["reward"] == rows["nop"]["reward"]
    for harness in ("planter", "file-planter"):
        assert not (Path(rows[harness]["trial_dir"]) / "verifier" / "reward.json").exists()


def test_the_tests_are_not_readable_in_the_sandbox_by_the_agents_user(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, write_harness: Any
) -> None:
    """The verifier itself looks: /tests is its own, mode 0700 (a root verifier's: root's, and the
    sandbox's root has no capabilities, so it cannot even try another user); /logs/verifier
    starts empty. The image's USER is uid 1000: the verifier is root because the task says so
    (`[verifier] user`), as Harbor would run it."""
    make_task(
        "probe",
        test="{ stat -c '%U %a' /tests; ls -A /logs/verifier | wc -l; } > /tmp/p.txt; "
        "mv /tmp/p.txt /logs/verifier/p.txt; echo 1 > /logs/verifier/reward.txt",
        task_toml='[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 30\nuser = "root"\n',
    )
    write_harness("nop", NOP)
    rows = run_harnesses(pytester, tmp_path, ["nop"])
    probe = (Path(rows["nop"]["trial_dir"]) / "verifier" / "p.txt").read_text().splitlines()
    assert probe == ["root 700", "0"]


def test_a_later_steps_agent_never_sees_an_earlier_steps_tests(
    pytester: pytest.Pytester, tmp_path: Path, write_harness: Callable[[str, str], Path]
) -> None:
    task = tmp_path / "datasets" / "ds" / "two-steps"
    for step in ("one", "two"):
        (task / "steps" / step).mkdir(parents=True)
        (task / "steps" / step / "instruction.md").write_text(f"Step {step}.\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(SLOW_TEST.replace("sleep 3; ", "") + "\n")
    (task / "tests" / "answer.txt").write_text(SECRET + "\n")
    (task / "environment").mkdir()
    (task / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nWORKDIR /app\n")
    (task / "task.toml").write_text(
        '[agent]\ntimeout_sec = 30\n[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n'
    )
    write_harness(
        "reader",
        """\
        kind = "program"
        command = ["bash", "-c", '''{ ls -A /tests; cat /tests/answer.txt; ls -A /logs/verifier
        } >> /app/seen.txt 2>&1; cat /tests/answer.txt > /app/out.txt 2>/dev/null; true''']
        """,
    )
    rows = run_harnesses(pytester, tmp_path, ["reader"])
    seen = [
        line
        for line in (Path(rows["reader"]["trial_dir"]) / "diff.patch").read_text().splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    assert SECRET not in "\n".join(seen)
    assert sum("No such file or directory" in line for line in seen) == 4  # /tests, twice
    assert rows["reader"]["reward"] == 0.0


# a sloppy image: a tool folder early in root's PATH that the agent's user may write
SLOPPY_IMAGE = f"FROM {BASE_IMAGE}\nRUN chmod 0777 /usr/local/bin\nWORKDIR /app\n"
SHADOW = f"""kind = "program"
command = ["bash", "-c", '''printf '#!/bin/sh\\necho {SECRET}\\n' > /usr/local/bin/cat
chmod +x /usr/local/bin/cat''']
"""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["shared", "task", "run"])
def test_a_separate_verifier_room_ignores_a_tool_the_agent_replaced_outside_app(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    where: str,
) -> None:
    """In the shared room (Harbor's default) a replaced `cat` would fool the verifier: the
    engine's diff shows it, and the trial is `tampered` (tests/test_redteam_tamper.py); in a
    separate room, asked for by the task or the run, it is not there, and the oracle's /app
    still is."""
    toml = "[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 30\n"
    if where == "task":
        toml += 'environment_mode = "separate"\n'
    _secret_task(make_task, dockerfile=SLOPPY_IMAGE, task_toml=toml)
    write_harness("shadow", SHADOW)
    extra = '[verifier]\nenvironment_mode = "separate"\n' if where == "run" else ""
    rows = run_harnesses(pytester, tmp_path, ["oracle", "shadow"], extra)
    assert rows["oracle"]["reward"] == 1.0
    assert rows["shadow"]["reward"] == 0.0
    assert rows["shadow"]["outcome"] == ("tampered" if where == "shared" else "fail")


def test_environment_mode_is_checked_in_task_and_run_files(
    make_task: TaskMaker, tmp_path: Path
) -> None:
    task = make_task("bad", task_toml='[verifier]\nenvironment_mode = "apart"\n')
    with pytest.raises(SpecError, match=r"task.toml: key 'verifier.environment_mode'"):
        load_task(task)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle"]\ndatasets = ["ds"]\n[verifier]\nenvironment_mode = "apart"\n'
    )
    with pytest.raises(SpecError, match=r"key 'verifier.environment_mode'"):
        load_run_spec(run_file, Overrides())


def test_emptying_a_sandbox_leaves_only_a_fresh_init_whatever_ran_and_init_reaps(
    tmp_path: Path, docker_client: Any
) -> None:
    """Below the trial, as the engine lists it from outside: a daemon that forks in a loop, a
    root process and one whose name holds a newline are gone once the sandbox is emptied
    (killed whole, started again), its files kept; an orphan that exits is reaped by PID 1
    (HEMRA's keeper, the image having perl and no ENTRYPOINT), never left a zombie. Then the
    same left again, and every process but PID 1 killed from the host (`end_all_but_init`):
    PID 1 alone, the same one, and the files kept."""
    provider = DockerProvider(docker_client)
    request = SandboxRequest(BASE_IMAGE, Limits(pids=256), network=False, labels={"hemra": "1"})
    logs = tmp_path / "x.txt"

    def run(user: str, command: str) -> None:
        sandbox.exec(
            ["sh", "-c", command],
            user=user,
            env={},
            timeout=10,
            stdout=logs,
            stderr=logs,
            workdir="/",
        )

    def processes() -> list[list[str]]:
        listed = sandbox.container.top(ps_args="-o pid,stat,comm")
        return [row[1:] for row in listed["Processes"]]

    def leave_processes() -> None:
        run(ROOT_USER, "(setsid sleep 500 &)")
        run(ROOT_USER, "(setsid sh -c 'printf \"x\\ny\" > /proc/self/comm; sleep 500' &)")
        assert sorted(comm for _, comm in processes())[:3] == ["hemra-init", "sleep", "sleep"]
        assert any("\n" in comm or "?" in comm for _, comm in processes())
        fork_loop = (  # last: it fills the pids limit
            "( setsid sh -c 'while :; do (sleep 30 &); sleep 0.01; done' >/dev/null 2>&1 & )"
        )
        run(AGENT_USER, fork_loop)
        assert len(processes()) > 4

    with provider.open(request) as sandbox:
        run(ROOT_USER, "echo kept > /tmp/kept")
        leave_processes()
        sandbox.empty()
        assert [comm for _, comm in processes()] == ["hemra-init"]  # started again: PID 1 alone
        run(ROOT_USER, "(sleep 0.2 &); exit 0")  # its sleep: an orphan of PID 1's
        time.sleep(1.5)  # the keeper reaps within a second
        assert [stat for stat, _ in processes() if stat.startswith("Z")] == []
        assert list(sandbox.read_tree("/tmp/kept").values()) == [b"kept\n"]
        init = sandbox.container.top(ps_args="-o pid")["Processes"]
        leave_processes()
        assert sandbox.end_all_but_init() and sandbox.missed is None
        assert sandbox.container.top(ps_args="-o pid")["Processes"] == init  # the same PID 1
        assert list(sandbox.read_tree("/tmp/kept").values()) == [b"kept\n"]
        # where it cannot be done, it says why (and the caller kills the sandbox whole)
        nowhere = "0" * 64
        assert end_all_but_init(nowhere, 1) == "no freezer cgroup of the container on this host"
        leave_processes()
        taken = end_all_but_init(sandbox.container.id, 999_999_999)  # PID 1 not the one given
        # killed with the rest: the container stops, its cgroup gone as it is read, or just after
        assert taken is not None
        assert taken == "PID 1 gone" or taken.startswith("the cgroup unreadable"), taken
        assert not sandbox.end_all_but_init() and sandbox.missed is not None  # stopped: why
        sandbox.halt()
        assert not sandbox.end_all_but_init() and sandbox.missed is None  # halted: nothing missed


def test_the_oracle_passes_swe_and_multi_step_tasks_in_a_separate_room(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle"]\ndatasets = ["swe-mini", "multi-step"]\n'
        'tasks = ["fizzbuzz-fix", "greet-review-revise"]\n'
        '[verifier]\nenvironment_mode = "separate"\n'
    )
    pytester.runpytest("--hemra-run", str(run_file))
    connection = sqlite3.connect(pytester.path / ".hemra" / "hemra.db")
    found = dict(connection.execute("SELECT task, reward FROM trials").fetchall())
    connection.close()
    assert found == {"fizzbuzz-fix": 1.0, "greet-review-revise": 1.0}


def test_a_huge_sparse_app_is_copied_to_a_separate_room_only_up_to_its_cap(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("pytest_hemra.score.room.MAX_ROOM_COPY_BYTES", 1 << 20)
    toml = (
        '[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 30\nenvironment_mode = "separate"\n'
    )
    _secret_task(make_task, task_toml=toml)
    write_harness(
        "bloat",
        'kind = "program"\n'
        'command = ["bash", "-c", "truncate -s 100G /app/huge; echo no > /app/out.txt"]\n',
    )
    rows = run_harnesses(pytester, tmp_path, ["bloat"])
    assert (rows["bloat"]["outcome"], rows["bloat"]["reward"]) == ("fail", 0.0)
    room = Path(rows["bloat"]["trial_dir"]) / "verifier" / "room.txt"
    assert "first entries only" in room.read_text()


def test_a_separate_room_receives_the_tasks_declared_artifacts(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
) -> None:
    make_task(
        "artifact",
        test='[ "$(cat /srv/out/result.txt)" = hi ] && [ ! -e /srv/other.txt ]; '
        "if [ $? = 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt",
        dockerfile=f"FROM {BASE_IMAGE}\nRUN chmod 0777 /srv\nWORKDIR /app\n",
        task_toml='artifacts = ["/srv/out/result.txt"]\n'
        '[verifier]\nenvironment_mode = "separate"\n',
    )
    write_harness("nop", NOP)
    write_harness(
        "maker",
        'kind = "program"\ncommand = ["bash", "-c", '
        '"mkdir /srv/out && echo hi > /srv/out/result.txt && echo x > /srv/other.txt"]\n',
    )
    rows = run_harnesses(pytester, tmp_path, ["nop", "maker"])
    assert (rows["maker"]["reward"], rows["nop"]["reward"]) == (1.0, 0.0)
    task = make_task("bad", task_toml='artifacts = ["../etc/passwd"]\n')
    with pytest.raises(SpecError, match=r"key 'artifacts': expected an absolute path"):
        load_task(task)
