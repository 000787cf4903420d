"""Red team: rewards with provenance, and every planned trial counted. A program the agent leaves
for the verifier to run writes the reward itself; an answer the verifier cannot read makes a
trial unscoreable; neither raises a harness's numbers above what failing would give it. And a
task HEMRA could not run for one harness leaves every harness's numbers, flagged."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import BASE_IMAGE, REPO, TaskMaker
from pytest_hemra.core.errors import Tampered
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.report.formats import render
from pytest_hemra.report.tables import build_report
from pytest_hemra.score.provenance import check_rewards, declared_kinds, refuse_planted
from pytest_hemra.store import Store

# the verifier runs the agent's program as root, as most Harbor verifiers do, then writes
# reward.txt from what it printed
RUNS_APP = (
    'out="$(bash /app/check.sh 2>/dev/null)"\n'
    'if [ "$out" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt'
)
# ... the same, from a task whose tests also name reward.json (a comment): both kinds declared
RUNS_APP_NAMING_BOTH = "# Harbor reads /logs/verifier/reward.json first\n" + RUNS_APP
JSON_ONLY = (
    'if [ "$(cat /app/out.txt 2>/dev/null)" = hi ]; then r=1; else r=0; fi\n'
    'echo "{\\"reward\\": $r, \\"style\\": 0.5}" > /logs/verifier/reward.json'
)
# an image whose USER is not root: agent and verifier run as it (Harbor's rule)
USER_IMAGE = (
    f"FROM {BASE_IMAGE}\nRUN useradd --create-home --uid 1500 dev && mkdir -p /app"
    " && chown dev:dev /app\nUSER dev\nWORKDIR /app\n"
)
# a program that computes nothing and writes the reward itself, for Harbor to read first
CHEAT = """cat > /app/check.sh <<'EOF'
echo '{"reward": 1}' > /logs/verifier/reward.json
echo 0
EOF
"""


def _program(script: str) -> str:
    return f'kind = "program"\ncommand = {json.dumps(["sh", "-c", script])}\n'


def _session(pytester: pytest.Pytester, tmp_path: Path, run_toml: str) -> list[TrialRecord]:
    run_file = tmp_path / "run.toml"
    run_file.write_text(run_toml)
    pytester.runpytest("--hemra-run", str(run_file))
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    return store.trials(run.id)


def _by_item(trials: list[TrialRecord]) -> dict[str, TrialRecord]:
    return {t.item_id: t for t in trials}


@pytest.mark.usefixtures("docker_test")
@pytest.mark.parametrize(
    ("room", "agent"),
    [("shared", "non-root"), ("separate", "non-root"), ("shared", "root"), ("shared", "image")],
)
def test_a_reward_the_agents_program_writes_for_the_verifier_scores_tampered(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    room: str,
    agent: str,
) -> None:
    """An agent (uid 1000, or root) leaves /app/check.sh; test.sh runs it as root, and it writes
    reward.json {"reward": 1} while test.sh writes reward.txt 0 after it. Harbor's order read
    1.0. Now: a kind the task's tests do not name, or one that disagrees with reward.txt, is
    `tampered` (reward 0), in either room, and whoever the verifier runs as: with an image
    whose USER is not root ("image"), agent and verifier are both that user (as Harbor runs
    them), and /logs/verifier is the verifier's own. The oracle still passes, whichever kind
    its task writes."""
    solve = "printf 'echo 42\\n' > /app/check.sh"
    image = {"dockerfile": f"FROM {BASE_IMAGE}\nWORKDIR /app\n"} if agent == "root" else {}
    if agent == "image":
        image = {"dockerfile": USER_IMAGE}
    make_task("runs-app", test=RUNS_APP, solve=solve, **image)
    make_task("runs-app-naming-both", test=RUNS_APP_NAMING_BOTH, solve=solve, **image)
    make_task("json-only", test=JSON_ONLY, **image)
    write_harness("cheat", _program(CHEAT))
    separate = '[verifier]\nenvironment_mode = "separate"\n' if room == "separate" else ""
    found = _by_item(
        _session(
            pytester, tmp_path, f'harnesses = ["oracle", "cheat"]\ndatasets = ["ds"]\n{separate}'
        )
    )
    for task in ("runs-app", "runs-app-naming-both", "json-only"):
        oracle = found[f"ds::{task}[oracle-1]"]
        assert (oracle.outcome, oracle.reward) == ("pass", 1.0), oracle.error
    assert found["ds::json-only[oracle-1]"].rewards == {"reward": 1.0, "style": 0.5}
    for task, why in (
        ("runs-app", "/logs/verifier/reward.json: the task's verifier writes only reward.txt"),
        ("runs-app-naming-both", "/logs/verifier/reward.json: gives reward 1, reward.txt 0"),
    ):
        cheat = found[f"ds::{task}[cheat-1]"]
        assert (cheat.outcome, cheat.reward, cheat.cause) == ("tampered", 0.0, "tampered")
        evidence = json.loads((Path(cheat.trial_dir or "") / "tampered.json").read_text())
        assert any(line.startswith(why) for line in evidence["evidence"]), evidence
    cheat = found["ds::json-only[cheat-1]"]
    assert (cheat.outcome, cheat.reward) == ("fail", 0.0)
    assert cheat.agent_user is not None
    expected = {"root": "0:", "non-root": "1000:", "image": "1500:"}[agent]
    assert cheat.agent_user.startswith(expected)
    verifier = (Path(cheat.trial_dir or "") / "verifier" / "user.txt").read_text()
    assert verifier.startswith(expected), verifier  # the image's USER, as Harbor runs it


# a program that leaves a writer behind, rewriting the kind test.sh writes, after test.sh
LINGERING_WRITER = """cat > /app/check.sh <<'EOF'
( while :; do echo 1 > /tmp/r; mv /tmp/r /logs/verifier/reward.txt; done ) >/dev/null 2>&1 &
echo 0
EOF
"""


@pytest.mark.xfail(
    strict=False,  # a race: the writer usually wins it (1.0), but not always under load (CI)
    reason="open: the room is emptied a few ms after test.sh exits (killed from the host around"
    " the keeper; ~100 ms where the sandbox is killed through the engine); a writer test.sh's run"
    " of the agent's program left behind can replace reward.txt in that gap (a fix: test.sh as"
    " the child of the room's PID 1, so the kernel kills its namespace the moment test.sh exits)",
)
@pytest.mark.usefixtures("docker_test")
@pytest.mark.parametrize("room", ["shared", "separate"])
def test_a_writer_the_agents_program_leaves_running_under_the_verifier_scores_no_pass(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    room: str,
) -> None:
    """test.sh runs the agent's program, which leaves a loop rewriting reward.txt 1 after
    test.sh has written its 0: the verifier's room is emptied before its rewards are read, and
    what is left there is never a pass."""
    make_task("runs-app", test=RUNS_APP, solve="printf 'echo 42\\n' > /app/check.sh")
    write_harness("writer", _program(LINGERING_WRITER))
    separate = '[verifier]\nenvironment_mode = "separate"\n' if room == "separate" else ""
    run_toml = f'harnesses = ["writer"]\ndatasets = ["ds"]\n{separate}'
    (trial,) = _session(pytester, tmp_path, run_toml)
    assert trial.outcome != "pass" and trial.reward == 0.0, (trial.outcome, trial.error)


def test_which_reward_files_a_task_writes_is_read_from_its_tests(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "lib").mkdir(parents=True)
    (tests / "test.sh").write_text("python3 /tests/lib/grade.py\n")
    assert declared_kinds([tests]) == {"reward.json", "reward.txt"}  # names neither: either
    other = tmp_path / "other" / "tests"
    other.mkdir(parents=True)
    (other / "grade.py").write_text('open("/logs/verifier/reward.txt", "w")\n')
    assert declared_kinds([other]) == {"reward.txt"}
    assert declared_kinds([other], ["/logs/verifier/reward.json"]) == {
        "reward.json", "reward.txt",
    }  # fmt: skip


@pytest.mark.usefixtures("docker_test")
def test_check_reports_a_task_whose_verifier_writes_a_reward_kind_its_tests_do_not_name(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, monkeypatch: Any
) -> None:
    """A test.sh that names reward.txt but writes reward.json through a name built at run time:
    its own oracle scores tampered, so `hemra check` says the task is broken, and why."""
    make_task(
        "built-name",
        test="# writes no reward.txt\nkind=json\n"
        'echo \'{"reward": 1}\' > "/logs/verifier/reward.$kind"',
    )
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    checked = pytester.run(
        "hemra", "check", str(tmp_path / "datasets" / "ds"), "--store", str(tmp_path / "s.db"),
        "--format", "json", timeout=240,
    )  # fmt: skip
    assert checked.ret == 1, checked.errlines[-20:]
    (task,) = json.loads(checked.stdout.str())["tasks"]
    assert task["verdicts"] == ["broken"]
    assert task["notes"][0].startswith(
        "oracle tampered (reward 0): a reward file the task's verifier did not write"
    )


def test_reward_files_the_verifier_did_not_write_are_refused_with_evidence() -> None:
    txt = frozenset({"reward.txt"})
    both = frozenset({"reward.json", "reward.txt"})
    check_rewards({"reward.txt": b"0\n", "out.log": b"x"}, txt)  # honest: nothing raised
    check_rewards({"reward.json": b'{"reward": 1}', "reward.txt": b"1"}, both)  # agree
    check_rewards({"reward.json": b'{"a": 1, "b": 0}', "reward.txt": b"0.5"}, both)  # metrics
    with pytest.raises(Tampered) as planted:
        refuse_planted({"reward.txt": b"1"})
    assert planted.value.evidence == ("/logs/verifier/reward.txt: present before test.sh started",)
    with pytest.raises(Tampered) as unknown:
        check_rewards({"reward.json": b'{"reward": 1}', "reward.txt": b"0"}, txt)
    assert unknown.value.evidence[0].startswith("/logs/verifier/reward.json: the task's verifier")
    with pytest.raises(Tampered) as disagree:
        check_rewards({"reward.json": b'{"reward": 1}', "reward.txt": b"oops"}, both)
    assert "gives reward 1, reward.txt no number" in disagree.value.evidence[0]


# an answer the verifier reads: a FIFO or a link to /dev/zero hangs it until its timeout
HARD = (
    'if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt'
)
UNSCOREABLE = {
    "fails-hard": "echo 41 > /app/answer.txt",  # the honest failure the others must equal
    "fifo": "mkfifo /app/answer.txt",
    "dev-zero": "ln -s /dev/zero /app/answer.txt",
}


@pytest.mark.usefixtures("docker_test")
def test_a_harness_that_makes_half_its_trials_unscoreable_gets_the_numbers_of_one_that_fails(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
) -> None:
    """Two tasks; each harness solves the easy one. On the hard one `fails-hard` answers wrong,
    `fifo` and `dev-zero` leave an answer the verifier hangs on: verifier_error, scored 0 as a
    fail, never dropped. Dropped, they read 1.000 against the honest failure's 0.500."""
    make_task("easy")
    make_task(
        "hard",
        test=HARD,
        solve="echo 42 > /app/answer.txt",
        task_toml="[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 3\n",
    )
    for name, script in UNSCOREABLE.items():
        write_harness(name, _program(f"echo hi > /app/out.txt; {script}"))
    names = ", ".join(f'"{h}"' for h in ["oracle", *UNSCOREABLE])
    trials = _session(
        pytester, tmp_path, f'harnesses = [{names}]\ndatasets = ["ds"]\nattempts = 2\n'
    )
    found = _by_item(trials)
    for name in ("fifo", "dev-zero"):
        for attempt in (1, 2):
            trial = found[f"ds::hard[{name}-{attempt}]"]
            assert (trial.outcome, trial.reward) == ("verifier_error", 0.0), trial.error
            assert "3s timeout" in (trial.error or "")
        assert found[f"ds::easy[{name}-1]"].outcome == "pass"

    store = Store(pytester.path / ".hemra" / "hemra.db")
    report = build_report(store, trials[0].run_id)
    (dataset,) = report.datasets
    assert dataset.tasks_left_out == {} and dataset.counted_tasks == ["easy", "hard"]
    rows = {row.harness: row for row in dataset.harnesses}

    def numbers(row: Any) -> tuple[Any, ...]:
        return (row.reward, row.pass_rate, row.versus, row.pass_at_k, row.pass_hat_k,
                row.tasks, row.scored, row.passes, row.pass_k_tasks)  # fmt: skip

    assert rows["fails-hard"].reward is not None and rows["fails-hard"].reward.mean == 0.5
    assert numbers(rows["fifo"]) == numbers(rows["fails-hard"])
    assert numbers(rows["dev-zero"]) == numbers(rows["fails-hard"])
    exported = {
        h["harness"]: h for h in json.loads(render(report, "json"))["datasets"][0]["harnesses"]
    }
    keys = ("reward", "pass_rate", "versus", "pass_at_k", "pass_hat_k", "tasks")
    for name in ("fifo", "dev-zero"):
        assert {k: exported[name][k] for k in keys} == {k: exported["fails-hard"][k] for k in keys}
    text = render(report, "text")
    assert "! fifo: 2 trials scored 0 with no reward from the verifier (verifier_error" in text


@pytest.mark.usefixtures("docker_test")
def test_an_answer_the_verifier_hangs_on_scores_0_in_a_separate_room_too(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
) -> None:
    """The FIFO and the link reach the separate room with /app (copied as they are, never
    read on the way) and hang its verifier the same: verifier_error, 0, a failed test."""
    make_task("hard", test=HARD, task_toml="[verifier]\ntimeout_sec = 3\n")
    for name in ("fifo", "dev-zero"):
        write_harness(name, _program(UNSCOREABLE[name]))
    trials = _session(
        pytester,
        tmp_path,
        'harnesses = ["fifo", "dev-zero"]\ndatasets = ["ds"]\n'
        '[verifier]\nenvironment_mode = "separate"\n',
    )
    assert sorted((t.harness, t.outcome, t.reward) for t in trials) == [
        ("dev-zero", "verifier_error", 0.0), ("fifo", "verifier_error", 0.0),
    ]  # fmt: skip
    assert all("3s timeout" in (t.error or "") for t in trials)


@pytest.mark.usefixtures("docker_test")
def test_a_task_whose_infra_error_persists_leaves_every_harness_numbers_flagged(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    """A task whose environment never comes up (its healthcheck fails: not the agent's doing)
    is retried, then leaves every harness's numbers together; the table and JSON say so."""
    make_task("easy")
    make_task(
        "broken-env",
        task_toml='[environment.healthcheck]\ncommand = "false"\ninterval_sec = 0.1\nretries = 1\n',
    )
    trials = _session(
        pytester,
        tmp_path,
        'harnesses = ["oracle", "nop"]\ndatasets = ["ds"]\nmax_infra_retries = 1\n',
    )
    store = Store(pytester.path / ".hemra" / "hemra.db")
    run_id = trials[0].run_id
    broken = [t for t in store.trials(run_id, history=True) if t.task == "broken-env"]
    assert sorted((t.harness, t.outcome) for t in broken) == [
        ("nop", "infra_error"), ("nop", "infra_error"),
        ("oracle", "infra_error"), ("oracle", "infra_error"),
    ]  # fmt: skip
    report = build_report(store, run_id)
    (dataset,) = report.datasets
    rows = {row.harness: row for row in dataset.harnesses}
    assert rows["oracle"].tasks == rows["nop"].tasks == 1
    assert rows["oracle"].reward is not None and rows["oracle"].reward.mean == 1.0
    assert rows["nop"].versus is not None and rows["nop"].versus.n_tasks == 1
    text = render(report, "text")
    assert "(2 tasks, 1 counted)" in text
    assert (
        "! 1 of 2 tasks left out of every harness's numbers (broken-env: oracle infra_error,"
        " nop infra_error): every number is over the same 1 task"
    ) in text
    exported = json.loads(render(report, "json"))["datasets"][0]
    assert exported["tasks_left_out"] == {"broken-env": ["oracle infra_error", "nop infra_error"]}
    assert exported["counted_tasks"] == ["easy"]
    assert [f["kind"] for f in exported["flags"]].count("task_set") == 1
