"""Red team: the room is emptied by the kernel, not by reading a listing. Hostile harnesses leave
a process behind that a listing of /proc misreads (a name with a newline, a main thread gone
while another runs on: a zombie to a listing) or fill the pids limit; each runs as a real trial
against a task whose answer is in the hidden tests alone, and scores what `nop` scores."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import BASE_IMAGE, TaskMaker
from tests.redteam import run_harnesses

pytestmark = pytest.mark.usefixtures("docker_test")

SECRET = "answer-5e07"
# the answer is in the hidden tests alone, and the verifier takes its time, as a real suite
# does: a process still running when the tests enter could copy it into /app meanwhile
SLOW_TEST = (
    'sleep 3; if [ "$(cat /app/out.txt 2>/dev/null)" = "$(cat /tests/answer.txt)" ]; '
    "then echo 1; else echo 0; fi > /logs/verifier/reward.txt"
)
# a root image (no USER: the agent is root unless the run asks for non-root) with python3, for
# a process whose main thread exits while another runs
IMAGE = (
    f"FROM {BASE_IMAGE}\n"
    "RUN apt-get update && apt-get install -y --no-install-recommends python3"
    " && rm -rf /var/lib/apt/lists/*\nWORKDIR /app\n"
)
NOP = 'kind = "program"\ncommand = ["true"]\n'
COPY_ANSWER = "cat /tests/answer.txt > /app/.a 2>/dev/null && mv /app/.a /app/out.txt"
# re-parented, in a session of its own, its output let go: the harness's command ends at once
LAUNCH = "( setsid nohup {program} >/dev/null 2>&1 & ); exit 0"


def _harness(program: str, script: str, before: str = "") -> str:
    launch = before + LAUNCH.format(program=program)
    return f'kind = "program"\ncommand = {json.dumps(["sh", "-c", launch, script])}\n'


# (a) a shell whose name (comm) holds a newline: /proc/<pid>/stat spans two lines
NEWLINE_NAME = _harness(
    'sh -c "$0"',
    f"printf 'x\\ny' > /proc/self/comm\nsleep 1\nwhile :; do {COPY_ANSWER}; sleep 0.05; done\n",
)
# (b) a process whose main thread has exited while another keeps running: listed as a zombie
THREAD_LEFT = _harness(
    'python3 -c "$0"',
    """\
import ctypes, os, shutil, threading, time
def plant():
    time.sleep(1)
    while True:
        try:
            shutil.copyfile("/tests/answer.txt", "/app/.a")
            os.replace("/app/.a", "/app/out.txt")
        except OSError:
            pass
        time.sleep(0.05)
threading.Thread(target=plant).start()
ctypes.CDLL(None).pthread_exit(None)
""",
)
# (d) a plain daemon: a root agent's in the shared room reads /tests when they enter
DAEMON = _harness('sh -c "$0"', f"sleep 1\nwhile :; do {COPY_ANSWER}; sleep 0.05; done\n")
# (c) fork bombs: one that stays the harness's command (its turn times out), one left behind
BOMB_STAYS = 'kind = "program"\ncommand = ["perl", "-e", "fork while 1; "]\n'
BOMB_LEFT = _harness('perl -e "$0"', "sleep 1; fork while 1;")

CHEATS = {"newline-name": NEWLINE_NAME, "thread-left": THREAD_LEFT, "daemon": DAEMON}
ROOMS = {
    "root-shared": "",
    "root-separate": '[verifier]\nenvironment_mode = "separate"\n',
    "nonroot-shared": '[sandbox]\nagent_user = "non-root"\n',
}


def _secret_task(make_task: TaskMaker, agent_timeout: int = 30, pids: int = 1024) -> Path:
    folder = make_task(
        "secret",
        test=SLOW_TEST,
        solve=f"echo {SECRET} > /app/out.txt",
        dockerfile=IMAGE,
        task_toml=f"[agent]\ntimeout_sec = {agent_timeout}\n[verifier]\ntimeout_sec = 30\n"
        f"[environment]\npids_limit = {pids}\n",
    )
    (folder / "tests" / "answer.txt").write_text(SECRET + "\n")
    return folder


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_a_process_a_listing_misreads_is_gone_before_the_tests_enter(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    room: str,
) -> None:
    """A name with a newline, a main thread gone while another runs, a plain daemon: whatever
    its name, thread state or user, nothing the agent started still runs when the tests enter
    (its turn ended, the sandbox was killed whole and started again), so none copies the
    hidden answer in; the oracle still passes."""
    _secret_task(make_task)
    write_harness("nop", NOP)
    for name, harness in CHEATS.items():
        write_harness(name, harness)
    rows = run_harnesses(pytester, tmp_path, ["oracle", "nop", *CHEATS], ROOMS[room])
    assert (rows["oracle"]["outcome"], rows["oracle"]["reward"]) == ("pass", 1.0)
    assert (rows["nop"]["outcome"], rows["nop"]["reward"]) == ("fail", 0.0)
    for name in CHEATS:
        assert (rows[name]["outcome"], rows[name]["reward"]) == ("fail", 0.0), rows[name]
        assert rows[name]["reward"] <= rows["nop"]["reward"]


@pytest.mark.parametrize("room", ["root-shared", "nonroot-shared"])
def test_a_fork_bomb_filling_the_pids_limit_is_a_scored_trial_never_an_infra_error(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    room: str,
) -> None:
    """A fork bomb that stays the harness's command (its turn times out) and one it leaves
    behind (its command ends at once) both fill the pids limit; the sandbox is emptied by the
    kernel all the same, the verifier runs, and each trial scores as `nop` does."""
    _secret_task(make_task, agent_timeout=5, pids=64)
    write_harness("nop", NOP)
    write_harness("bomb-stays", BOMB_STAYS)
    write_harness("bomb-left", BOMB_LEFT)
    rows = run_harnesses(
        pytester, tmp_path, ["oracle", "nop", "bomb-stays", "bomb-left"], ROOMS[room]
    )
    assert (rows["oracle"]["outcome"], rows["oracle"]["reward"]) == ("pass", 1.0)
    assert (rows["bomb-stays"]["outcome"], rows["bomb-stays"]["reward"]) == ("timeout", 0.0)
    assert (rows["bomb-left"]["outcome"], rows["bomb-left"]["reward"]) == ("fail", 0.0)
    assert rows["bomb-left"]["reward"] <= rows["nop"]["reward"]


def test_a_reward_is_read_from_the_halted_room_past_a_log_over_the_file_cap(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    """The room is halted before its rewards are read (through the engine alone): a verifier
    log over the per-file cap is named and left out, and the reward beside it still read."""
    make_task(
        "big-log",
        test="head -c 3000000 /dev/zero > /logs/verifier/big.log; "
        'if [ "$(cat /app/out.txt)" = hi ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt",
    )
    rows = run_harnesses(pytester, tmp_path, ["oracle"])
    assert (rows["oracle"]["outcome"], rows["oracle"]["reward"]) == ("pass", 1.0)
    folder = Path(rows["oracle"]["trial_dir"]) / "verifier"
    assert (folder / "reward.txt").read_text().strip() == "1"
    assert (folder / "big.log").read_bytes() == b""


# what the verifier sees: whether a process left behind still touches /app once the tests are
# in, and whether PID 1 is the one the agent's turn ran beside (the sandbox not started again)
WATCH_TEST = (
    "rm -f /app/alive; sleep 1; if [ -e /app/alive ]; then echo alive; else echo gone; fi"
    " > /logs/verifier/seen.txt; "
    'if [ "$(cat /app/init.txt 2>/dev/null)" = "$(cut -d" " -f22 /proc/1/stat)" ]; '
    "then echo same; else echo restarted; fi > /logs/verifier/init.txt; "
    "echo 0 > /logs/verifier/reward.txt"
)
NOTE_INIT = "cut -d' ' -f22 /proc/1/stat > /app/init.txt"
WATCHED = {
    "quiet": f'kind = "program"\ncommand = {json.dumps(["sh", "-c", NOTE_INIT])}\n',
    "newline-name": _harness(
        'sh -c "$0"',
        "printf 'x\\ny' > /proc/self/comm\nwhile :; do : > /app/alive; sleep 0.05; done\n",
        before=f"{NOTE_INIT}; ",
    ),
    "thread-left": _harness(
        'python3 -c "$0"',
        """\
import ctypes, threading, time
def touch():
    while True:
        open("/app/alive", "w").close()
        time.sleep(0.05)
threading.Thread(target=touch).start()
ctypes.CDLL(None).pthread_exit(None)
""",
        before=f"{NOTE_INIT}; ",
    ),
}


@pytest.mark.parametrize("user", ["root", "non-root"])
def test_nothing_the_agent_left_runs_when_the_tests_enter_whoever_it_ran_as(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    user: str,
) -> None:
    """Seen by the verifier itself: a process named with a newline, or whose main thread has
    exited, no longer touches /app once the tests are in, for a root agent and a non-root one.
    Neither sandbox is started again: its PID 1 is HEMRA's keeper (the image has perl and no
    ENTRYPOINT), and every process but PID 1 is killed from the host, whoever the agent ran
    as (a root agent could not touch the keeper:
    `test_a_root_agent_cannot_take_the_keeper_over_and_what_it_left_under_any_uid_is_gone`)."""
    make_task("watch", test=WATCH_TEST, dockerfile=IMAGE)
    for name, harness in WATCHED.items():
        write_harness(name, harness)
    extra = '[sandbox]\nagent_user = "non-root"\n' if user == "non-root" else ""
    rows = run_harnesses(pytester, tmp_path, list(WATCHED), extra)
    seen = {}
    for name, row in rows.items():
        folder = Path(row["trial_dir"]) / "verifier"
        seen[name] = tuple((folder / f).read_text().strip() for f in ("seen.txt", "init.txt"))
    assert seen == {
        "quiet": ("gone", "same"),
        "newline-name": ("gone", "same"),
        "thread-left": ("gone", "same"),
    }


# a root agent that tries to take PID 1 over (read it, trace it, open its memory, signal it) and
# leaves a process under another uid, which the sandbox's root (no CAP_KILL) cannot signal
TAKE_OVER = (
    "head -c1 /proc/1/environ >/dev/null 2>&1 && echo environ >> /app/took.txt; "
    "perl -e 'exit(syscall(101, 16, 1, 0, 0) == -1)' && echo ptrace >> /app/took.txt; "
    'perl -e \'open(my $m, "+<", "/proc/1/mem") or exit 1\' && echo mem >> /app/took.txt; '
    "kill -TERM 1; kill -STOP 1; "
    f"{NOTE_INIT}; "
    "( setsid setpriv --reuid 4321 --regid 4321 --clear-groups"
    " sh -c 'while :; do : > /tmp/alive; sleep 0.05; done' >/dev/null 2>&1 & ); exit 0"
)
KEEPER_TEST = (
    "rm -f /tmp/alive; sleep 1; if [ -e /tmp/alive ]; then echo alive; else echo gone; fi"
    " > /logs/verifier/seen.txt; "
    'if [ "$(cat /app/init.txt 2>/dev/null)" = "$(cut -d" " -f22 /proc/1/stat)" ]; '
    "then echo same; else echo restarted; fi > /logs/verifier/init.txt; "
    'echo "$(cut -d" " -f2,3 /proc/1/stat) $(cat /app/took.txt 2>/dev/null)"'
    " > /logs/verifier/pid1.txt; echo 0 > /logs/verifier/reward.txt"
)


def test_a_root_agent_cannot_take_the_keeper_over_and_what_it_left_under_any_uid_is_gone(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
) -> None:
    """The keeper (PID 1 of a sandbox whose image has perl and no ENTRYPOINT) is non-dumpable:
    a root agent can neither read /proc/1/environ, nor ptrace it, nor open its memory, and its
    signals are dropped; a process it left as another uid is gone before the verifier runs,
    killed from the host beside the same PID 1 (or, where that cannot end in time, by the
    restart). On docker-init
    as PID 1 the first three succeed (the test's own check that they can)."""
    make_task("keeper", test=KEEPER_TEST, dockerfile=f"FROM {BASE_IMAGE}\nWORKDIR /app\n")
    write_harness(
        "takeover", f'kind = "program"\ncommand = {json.dumps(["sh", "-c", TAKE_OVER])}\n'
    )
    rows = run_harnesses(pytester, tmp_path, ["takeover"])
    folder = Path(rows["takeover"]["trial_dir"]) / "verifier"
    seen = {name: (folder / f"{name}.txt").read_text().strip() for name in ("seen", "init", "pid1")}
    # the verifier beside the same PID 1: the kill from the host; once, in CI on a loaded machine,
    # it did not end within its 5 s and the sandbox was started again (the safe fallback), so
    # either is accepted here, the fallback saying why in the trial's sandbox.txt;
    # test_emptying_a_sandbox_... asserts the kill from the host itself
    notes = Path(rows["takeover"]["trial_dir"]) / "sandbox.txt"
    why = notes.read_text() if notes.exists() else ""
    assert seen in (
        {"seen": "gone", "init": "same", "pid1": "(hemra-init) S"},
        {"seen": "gone", "init": "restarted", "pid1": "(hemra-init) S"},
    ), why
    assert (seen["init"] == "restarted") == why.startswith("after the agent's turn: "), why


ENTRY_IMAGE = f"""FROM {BASE_IMAGE}
RUN printf '#!/bin/sh\\nexec "$@"\\n' > /entry.sh && chmod 755 /entry.sh
WORKDIR /app
ENTRYPOINT ["/entry.sh"]
"""
# the entrypoint rewritten to start a daemon: it would run as root when the sandbox starts again
REWRITE_ENTRY = (
    "printf '#!/bin/sh\\n( while :; do "
    + COPY_ANSWER
    + '; perl -e "select(undef, undef, undef, 0.05)"; done ) &\\nexec "$@"\\n\' > /entry.sh'
)


def test_a_root_agent_that_rewrites_the_entrypoint_run_again_after_its_turn_is_tampered(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
) -> None:
    """The sandbox is started again after the agent's turn, so the image's entrypoint runs
    again: a root agent that rewrote it (to copy the hidden answer in once the tests enter) is
    caught by the engine's diff before it runs, and scores 0 as `tampered`."""
    folder = make_task(
        "secret", test=SLOW_TEST, solve=f"echo {SECRET} > /app/out.txt", dockerfile=ENTRY_IMAGE
    )
    (folder / "tests" / "answer.txt").write_text(SECRET + "\n")
    write_harness("nop", NOP)
    write_harness(
        "rewriter", f'kind = "program"\ncommand = {json.dumps(["sh", "-c", REWRITE_ENTRY])}\n'
    )
    rows = run_harnesses(pytester, tmp_path, ["oracle", "nop", "rewriter"])
    assert (rows["oracle"]["outcome"], rows["oracle"]["reward"]) == ("pass", 1.0)
    assert (rows["rewriter"]["outcome"], rows["rewriter"]["reward"]) == ("tampered", 0.0)
    evidence = json.loads((Path(rows["rewriter"]["trial_dir"]) / "tampered.json").read_text())
    assert evidence["evidence"] == ["/entry.sh: the image's ENTRYPOINT, run as root"]
