"""Red team: an agent that tries to exhaust or confuse the runner rather than the verifier. It
floods its stdout and stderr, fills /logs/agent, leaves 200,000 files for the sandbox's removal
to go through, or names files with newlines, ESC sequences and quotes for whoever reads its
diff. Each trial still ends with its own result, the trial folder bounded, never a free rerun,
and nothing it chose reaches a terminal raw."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import TaskMaker
from pytest_hemra.core.text import printable, printable_lines
from pytest_hemra.execute.diff import quote_path, write_diff
from pytest_hemra.execute.output import CappedOutput, marker
from pytest_hemra.store import Store

pytestmark = pytest.mark.usefixtures("docker_test")

MiB = 1 << 20
FLOOD_BYTES = 300 * MiB
# a first and a last line, 300 MiB of "xxxxxxx" lines between; 2 MiB on stderr; four 900 KiB
# logs in /logs/agent; then the task done honestly
FLOOD = (
    "echo START-OF-FLOOD; yes xxxxxxx | head -c {size}; echo END-OF-FLOOD; "
    "(echo START-ERR; yes yyyyyyy | head -c 2097152; echo END-ERR) >&2; "
    "for i in 1 2 3 4; do head -c 921600 /dev/urandom > /logs/agent/log$i.bin; done; "
    "echo hi > /app/out.txt"
)


def _trials(folder: Path) -> list[Any]:
    store = Store(folder / ".hemra" / "hemra.db")
    return [trial for run in store.runs() for trial in store.trials(run.id)]


def _run(pytester: pytest.Pytester, tmp_path: Path, name: str, extra: str = "") -> Any:
    run_file = tmp_path / f"{name}.toml"
    run_file.write_text(f'harnesses = ["{name}"]\ndatasets = ["ds"]\n{extra}')
    result = pytester.runpytest("--hemra-run", str(run_file))
    (trial,) = [t for t in _trials(pytester.path) if t.harness == name]
    return result, trial


def test_a_stdout_flood_is_kept_as_head_and_tail_and_the_trial_is_still_scored(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    make_task("one")
    command = ["bash", "-c", FLOOD.format(size=FLOOD_BYTES)]
    write_harness("flood", f'kind = "program"\ncommand = {json.dumps(command)}\n')
    caps = "[sandbox]\noutput_cap_mb = 1\nfolder_cap_mb = 2\n"
    result, trial = _run(pytester, tmp_path, "flood", caps)
    result.assert_outcomes(passed=1)
    assert (trial.outcome, trial.reward, trial.retries) == ("pass", 1.0, 0)
    agent = Path(trial.trial_dir) / "agent"
    printed = len("START-OF-FLOOD\n") + FLOOD_BYTES + len("END-OF-FLOOD\n")
    cut = printed - MiB
    out = (agent / "stdout.txt").read_bytes()
    assert out.startswith(b"START-OF-FLOOD\nxxx") and out.endswith(b"xxx\nEND-OF-FLOOD\n")
    assert len(out) == MiB + len(marker(cut, MiB))
    assert marker(cut, MiB) in out
    err = (agent / "stderr.txt").read_bytes()
    assert err.startswith(b"START-ERR\n") and err.endswith(b"yyy\nEND-ERR\n")
    cuts = json.loads((agent / "cuts.json").read_text())
    assert cuts["stdout.txt"]["cut"] == cut
    assert cuts["stderr.txt"]["cut"] == len("START-ERR\n") + 2 * MiB + len("END-ERR\n") - MiB
    # the trial folder keeps 2 MiB of the agent's logs: two of the four, the rest named
    kept = sorted(path.name for path in (agent / "logs").iterdir())
    assert kept == ["log1.bin", "log2.bin"]
    note = json.loads((Path(trial.trial_dir) / "folder-cap.json").read_text())
    assert (note["left_out_files"], note["left_out_bytes"]) == (2, 2 * 921600)
    left_out = [entry["path"] for entry in note["left_out"]]
    assert left_out == ["agent/logs/log3.bin", "agent/logs/log4.bin"]

    # without the keys: 16 MiB per stream, 256 MiB of logs
    command = ["bash", "-c", FLOOD.format(size=40 * MiB)]
    write_harness("flood-default", f'kind = "program"\ncommand = {json.dumps(command)}\n')
    result, trial = _run(pytester, tmp_path, "flood-default")
    assert (trial.outcome, trial.reward) == ("pass", 1.0)
    agent = Path(trial.trial_dir) / "agent"
    printed = len("START-OF-FLOOD\n") + 40 * MiB + len("END-OF-FLOOD\n")
    out = (agent / "stdout.txt").read_bytes()
    assert len(out) == 16 * MiB + len(marker(printed - 16 * MiB, 16 * MiB))
    assert out.endswith(b"\nEND-OF-FLOOD\n")
    assert (agent / "stderr.txt").stat().st_size == len("START-ERR\n") + 2 * MiB + 8
    assert len(list((agent / "logs").iterdir())) == 4
    assert not (Path(trial.trial_dir) / "folder-cap.json").exists()


def test_output_written_by_several_commands_keeps_one_cap_for_the_file(tmp_path: Path) -> None:
    path = tmp_path / "stdout.txt"
    for command in range(3):
        with CappedOutput(path, 100) as out:
            for line in range(50):
                out.write(f"{command}:{line:02d}\n".encode())
    text = path.read_bytes()
    assert text.startswith(b"0:00\n") and text.endswith(b"2:49\n")
    cut = 3 * 50 * 5 - 100
    assert len(text) == 100 + len(marker(cut, 100))
    assert json.loads((tmp_path / "cuts.json").read_text())["stdout.txt"]["cut"] == cut


MANY_FILES = (
    "mkdir -p /tmp/many && cd /tmp/many && for d in $(seq 1 200); do mkdir $d; "
    "(cd $d && seq 1 1000 | xargs touch); done; echo hi > /app/out.txt"
)


def test_a_teardown_slowed_by_200k_files_is_the_trials_own_time_never_a_free_rerun(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the removal's answer awaited 0.5 s (the engine's client waits 120 s): 200k files take
    # the engine ~3 s to remove, so the client gives up on it while the engine answers pings
    monkeypatch.setenv("HEMRA_REMOVE_TIMEOUT_SECS", "0.5")
    # 200k files take the agent ~10 s on a quiet machine, over 30 s on a loaded CI one: its
    # time is not what this test is about
    make_task("one", task_toml="[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 60\n")
    command = ["bash", "-c", MANY_FILES]
    write_harness("many-files", f'kind = "program"\ncommand = {json.dumps(command)}\n')
    result, trial = _run(pytester, tmp_path, "many-files", "max_infra_retries = 2\n")
    result.assert_outcomes(passed=1)
    assert (trial.outcome, trial.reward, trial.swe_class) == ("pass", 1.0, None)
    assert trial.retries == 0 and trial.replaces is None
    assert len(_trials(pytester.path)) == 1  # no rerun, free or not
    phases = json.loads((Path(trial.trial_dir) / "result.json").read_text())["phases"]
    assert phases["teardown"] > 0.5  # the removal outlasted the client's wait, and was waited
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=hemra.trial={trial.id}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert left.stdout.strip() == ""


ODD_NAMES = [
    "new\nline.txt",
    "forged\n+++ b_evil.txt",
    "esc\x1b[2J\x1b[31mred.txt",
    'quo"te.txt',
    "cr\rhidden.txt",
    "back\\slash.txt",
    "caf\u00e9.txt",
    "sp ace.txt",
]
# a model call through the gateway, by hand (bash's /dev/tcp), for a model whose name clears
# the screen and sets the terminal's title: its name is kept with the call, and shown
EVIL_MODEL = "evil\x1b[2J\x1b]0;pwned\x07-model"
CALL = r"""
u=${HEMRA_BASE_URL#http://}; at=${u%%/*}; path=${u#"$at"}; host=${at%%:*}; port=${at##*:}
model='evil\u001b[2J\u001b]0;pwned\u0007-model'
body='{"model":"'$model'","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'
head='POST %s/v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\n'
head+='content-type: application/json\r\nanthropic-version: 2023-06-01\r\n'
head+='content-length: %s\r\nconnection: close\r\n\r\n%s'
exec 3<>/dev/tcp/$host/$port
printf "$head" "$path" "$host" "$HEMRA_API_KEY" "${#body}" "$body" >&3
timeout 10 cat <&3 >/dev/null
"""


def test_file_names_and_model_names_with_control_characters_reach_no_terminal_raw(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    upstream: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    make_task("one")
    # bash's $'...' for the control characters, every byte an octal escape
    script = "cd /app && " + "; ".join(
        f"printf 'x\\n' > $'{_bash_quoted(name)}'" for name in ODD_NAMES
    )
    script += "; echo hi > /app/out.txt\n" + CALL
    write_harness(
        "odd-names", f'kind = "program"\ncommand = {json.dumps(["bash", "-c", script])}\n'
    )
    # an upstream that answers with the model it was asked for, as providers do
    models = f'model = "claude-sonnet-4-5"\n[providers.anthropic]\nbase_url = "{upstream.url}"\n'
    result, trial = _run(pytester, tmp_path, "odd-names", models)
    result.assert_outcomes(passed=1)
    summary = result.stdout.str()  # the terminal summary: a flag names the other model
    assert printable(EVIL_MODEL) in summary and "\x1b" not in summary
    diff = (Path(trial.trial_dir) / "diff.patch").read_text()
    headers = [line for line in diff.splitlines() if line.startswith(("--- ", "+++ "))]
    assert all("\x1b" not in line and "\r" not in line for line in headers)
    assert len(headers) == 2 * (len(ODD_NAMES) + 1)  # no name forged a header of its own
    if shutil.which("git"):
        assert headers == _git_headers(tmp_path / "git", [*ODD_NAMES, "out.txt"])
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (call,) = store.calls(trial=trial.id)
    assert call.model_requested == call.model == EVIL_MODEL  # kept as the agent sent it
    shown = subprocess.run(
        ["hemra", "show", trial.id, "--store", str(pytester.path / ".hemra" / "hemra.db")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert printable(EVIL_MODEL) in shown.stdout and "\x1b" not in shown.stdout


def _bash_quoted(name: str) -> str:
    """`name` inside bash's $'...': every byte an octal escape."""
    return "".join(f"\\{byte:03o}" for byte in name.encode())


def _git_headers(folder: Path, names: list[str]) -> list[str]:
    """The ---/+++ lines `git diff` writes for `names` added, each holding "x\\n" (out.txt
    "hi\\n")."""
    folder.mkdir()
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    for name in names:
        (folder / name).write_text("hi\n" if name == "out.txt" else "x\n")
    git = ["git", "-C", str(folder), "-c", "core.quotePath=true"]
    subprocess.run([*git, "add", "-A"], check=True)
    text = subprocess.run(
        [*git, "diff", "--cached"], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in text.splitlines() if line.startswith(("--- ", "+++ "))]


def test_quote_path_matches_gits_quote_c_style() -> None:
    assert quote_path("a/plain.txt") == "a/plain.txt"
    assert quote_path("a/sp ace") == "a/sp ace"
    assert quote_path("a/caf\u00e9") == '"a/caf\\303\\251"'
    assert quote_path("b/new\nline") == '"b/new\\nline"'
    assert quote_path("b/\x1b[2J") == '"b/\\033[2J"'
    assert quote_path('b/"q"\\') == '"b/\\"q\\"\\\\"'
    assert quote_path("b/\x07\x08\t\x0b\x0c\r\x7f") == '"b/\\a\\b\\t\\v\\f\\r\\177"'
    assert quote_path("b/\udcff") == '"b/\\377"'  # a byte that is not UTF-8, as tar gave it


def test_a_diff_past_its_cap_stops_there_and_says_what_it_left_out(tmp_path: Path) -> None:
    after = {f"f{index:03d}.txt": b"line\n" * 100_000 for index in range(128)}  # 64 MiB
    path = tmp_path / "diff.patch"
    size = write_diff({}, after, path, cap=1 << 20)
    text = path.read_text()
    assert size == path.stat().st_size < (1 << 20) + 200
    assert text.startswith("--- /dev/null\n+++ b/f000.txt\n@@ -0,0 +1,100000 @@\n+line\n")
    assert text.endswith("cut at 1048576 bytes, in f001.txt; 126 more changed files not shown\n")


def test_printable_escapes_every_control_character_an_agent_may_send() -> None:
    assert printable("a\x1b[2Jb\rc\nd\te\x07\x7f\x9b\u202e") == (
        "a\\e[2Jb\\rc\\nd\\te\\x07\\x7f\\x9b\\u202e"
    )
    assert printable_lines("one\n\x1b]0;title\x07two\tthree") == ("one\n\\e]0;title\\x07two\tthree")
    assert printable("plain text, caf\u00e9") == "plain text, caf\u00e9"


def test_a_diff_crafted_to_be_costly_to_match_is_made_in_bounded_work(tmp_path: Path) -> None:
    # every other line of 20,000 changed: difflib alone would take ~40 s on this file; lines
    # found once on each side anchor the match (as git's patience diff), so it is made at once
    old = "".join(f"{i}\n" for i in range(20_000)).encode()
    new = "".join(f"{i}\n" if i % 2 else f"y{i}\n" for i in range(20_000)).encode()
    head = "".join(f"same {i}\n" for i in range(10)).encode()
    write_diff({"f.txt": head + old + head}, {"f.txt": head + new + head}, tmp_path / "p")
    lines = (tmp_path / "p").read_text().splitlines()
    assert [line for line in lines if line.startswith("@@")] == ["@@ -8,20005 +8,20005 @@"]
    assert lines[3:9] == [" same 7", " same 8", " same 9", "-0", "+y0", " 1"]
    # every line twice: one anchor alone (the middle line, once its twin is set aside as a
    # common last line), and each half, too big to match, is removed then added whole
    write_diff({"f.txt": old + old}, {"f.txt": new + new}, tmp_path / "q")
    lines = (tmp_path / "q").read_text().splitlines()
    assert [line for line in lines if line.startswith("@@")] == ["@@ -1,40000 +1,40000 @@"]
    assert lines[3:5] == ["-0", "-1"] and lines[3 + 19_999] == "+y0"
    assert sorted(Counter(line[0] for line in lines[3:]).items()) == [
        (" ", 2),
        ("+", 39_998),
        ("-", 39_998),
    ]
    # a small change in a big file is matched as usual
    edited = old.replace(b"\n100\n", b"\nhundred\n").replace(b"\n15000\n", b"\nlate\n")
    write_diff({"f.txt": old}, {"f.txt": edited}, tmp_path / "r")
    hunks = [line for line in (tmp_path / "r").read_text().splitlines() if line[:2] == "@@"]
    assert hunks == ["@@ -98,7 +98,7 @@", "@@ -14998,7 +14998,7 @@"]


@pytest.mark.slow
def test_a_128_mib_change_to_app_costs_the_runner_under_200_mb_and_its_diff_is_capped(
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    from tests.test_redteam_files import peak_rss_mb

    make_task("one")
    write_harness(
        "honest", 'kind = "program"\ncommand = ["bash", "-c", "echo hi > /app/out.txt"]\n'
    )
    # 128 text files of 1 MiB (the per-file cap), 128 MiB in all (the tree read's cap)
    big = (
        "yes 'a line of the agent text' | head -c 1048576 > /tmp/one; "
        "for i in $(seq 1 128); do cp /tmp/one /app/big$i.txt; done; echo hi > /app/out.txt"
    )
    write_harness("big", f'kind = "program"\ncommand = {json.dumps(["bash", "-c", big])}\n')
    honest = peak_rss_mb(tmp_path, "honest")
    peak = peak_rss_mb(tmp_path, "big")
    print(f"runner peak RSS: honest trial {honest:.0f} MB, 128 MiB change {peak:.0f} MB")
    assert peak - honest < 200
    trials = {t.harness: t for t in _trials(tmp_path)}
    assert [(t.outcome, t.reward) for t in trials.values()] == [("pass", 1.0)] * 2
    diff = Path(trials["big"].trial_dir) / "diff.patch"
    assert diff.stat().st_size < (4 << 20) + 200
    assert diff.read_text().endswith("changed files not shown\n")


@pytest.mark.parametrize("room", ["shared", "separate"])
def test_a_root_agents_program_flooding_the_verifiers_output_is_capped_and_still_scored(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    room: str,
) -> None:
    # the verifier runs what the agent left in /app, as many Harbor verifiers do
    make_task(
        "runs-agent-code",
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\n",  # no USER: the agent is root
        test='bash /app/check.sh; if [ "$(cat /app/out.txt)" = hi ]; then echo 1; else echo 0;'
        " fi > /logs/verifier/reward.txt",
    )
    check = "yes zzzzzzz | head -c 52428800; echo END-OF-CHECK"
    script = f"echo {json.dumps(check)} > /app/check.sh; echo hi > /app/out.txt"
    write_harness(
        "floods-verifier", f'kind = "program"\ncommand = {json.dumps(["bash", "-c", script])}\n'
    )
    settings = f'[sandbox]\noutput_cap_mb = 1\n[verifier]\nenvironment_mode = "{room}"\n'
    result, trial = _run(pytester, tmp_path, "floods-verifier", settings)
    result.assert_outcomes(passed=1)
    assert (trial.outcome, trial.reward) == ("pass", 1.0)
    assert (trial.agent_user or "").startswith("0:0"), trial.agent_user  # a root agent
    out = (Path(trial.trial_dir) / "verifier" / "stdout.txt").read_bytes()
    cut = 50 * MiB + len("END-OF-CHECK\n") - MiB
    assert len(out) == MiB + len(marker(cut, MiB)) and out.endswith(b"zzz\nEND-OF-CHECK\n")
    cuts = json.loads((Path(trial.trial_dir) / "verifier" / "cuts.json").read_text())
    assert cuts["stdout.txt"]["cut"] == cut
