"""Trials in real Docker containers, driven through a real pytest session (pytester)."""

from __future__ import annotations

import json
import secrets
import sqlite3
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TaskMaker

pytestmark = pytest.mark.usefixtures("docker_test")


def run_rows(store: Path) -> list[dict[str, Any]]:
    connection = sqlite3.connect(store)
    connection.row_factory = sqlite3.Row
    rows = [dict(r) for r in connection.execute("SELECT * FROM trials ORDER BY seq")]
    connection.close()
    return rows


def outcomes(store: Path) -> dict[str, tuple[str, float | None]]:
    return {r["item_id"]: (r["outcome"], r["reward"]) for r in run_rows(store)}


@pytest.mark.slow
def test_oracle_passes_and_nop_fails_every_bundled_task(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    store = tmp_path / "hemra.db"
    result = pytester.runpytest(
        "--hemra-run",
        str(REPO / "examples" / "oracle-vs-nop.toml"),
        "--hemra-store",
        str(store),
        f"--junitxml={junit}",
    )

    found = outcomes(store)
    assert len(found) == 24
    for item, (outcome, reward) in found.items():
        if "[oracle-1]" in item:
            assert (outcome, reward) == ("pass", 1.0), item
        else:
            assert outcome == "fail", item
    assert found["hemra-offline::partial-credit[nop-1]"] == ("fail", 0.25)
    rewards = {r["item_id"]: json.loads(r["rewards"]) for r in run_rows(store)}
    assert rewards["hemra-offline::partial-credit[nop-1]"]["checks_total"] == 4
    result.assert_outcomes(passed=12, failed=12)
    result.stdout.fnmatch_lines(
        [
            "*hemra-offline@* (6 tasks)*",
            "nop (baseline)*6/6*0*",
            "oracle*6/6*6*1*",
            "*text-tools@* (6 tasks)*",
        ]
    )
    cases = ET.parse(junit).getroot().iter("testcase")
    properties = [{p.get("name"): p.get("value") for p in case.iter("property")} for case in cases]
    assert len(properties) == 24
    assert all(p["outcome"] in ("pass", "fail") and "reward" in p for p in properties)


def test_agent_past_its_timeout_ends_as_timeout_and_is_still_verified(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    make_task("slow", task_toml="[agent]\ntimeout_sec = 2\n")
    write_harness(
        "sleeper",
        """\
        kind = "program"
        command = ["bash", "-c", '''echo "$HEMRA_TIMEOUT_SECS $HEMRA_DEADLINE" > budget
        echo hi > out.txt; sleep 60 & sleep 60''']
    """,
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["sleeper"]\ndatasets = ["ds"]\n')

    result = pytester.runpytest("--hemra-run", str(run_file))

    result.assert_outcomes(failed=1)
    (row,) = run_rows(pytester.path / ".hemra" / "hemra.db")
    assert (row["outcome"], row["reward"]) == ("timeout", 1.0)  # the verifier still ran
    phases = json.loads(row["phases"])
    assert 2.0 <= phases["agent"] < 10
    trial_dir = Path(row["trial_dir"])
    assert "+2 " in (trial_dir / "diff.patch").read_text()  # the agent was told its budget
    assert (trial_dir / "verifier" / "reward.txt").read_text().strip() == "1"


def test_sandbox_is_locked_down_and_tests_are_hidden_from_the_agent(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HEMRA_SENTINEL_SECRET", "sentinel-3f9a")
    make_task(
        "probe",
        test="cp /app/probe.txt /logs/verifier/probe.txt; "
        "ls /sys/class/net > /logs/verifier/net.txt; echo 1 > /logs/verifier/reward.txt",
    )
    write_harness(
        "probe",
        """\
        kind = "program"
        command = ["bash", "-c", '''{ id -u; grep CapEff /proc/self/status; ls /tests 2>&1
        env; pwd; } > /app/probe.txt''']
    """,
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["probe"]\ndatasets = ["ds"]\n')

    result = pytester.runpytest("--hemra-run", str(run_file))

    result.assert_outcomes(passed=1)
    (row,) = run_rows(pytester.path / ".hemra" / "hemra.db")
    verifier = Path(row["trial_dir"]) / "verifier"
    probe = (verifier / "probe.txt").read_text().splitlines()
    assert probe[0] == "1000"
    assert probe[1].split() == ["CapEff:", "0000000000000000"]
    assert "No such file or directory" in probe[2]
    assert "sentinel-3f9a" not in "\n".join(probe)
    assert "HEMRA_TIMEOUT_SECS=30" in probe and "/app" in probe
    assert (verifier / "net.txt").read_text().split() == ["lo"]  # verifier network off


@pytest.mark.parametrize(
    ("test_script", "expected"),
    [
        ("true", "verifier wrote no /logs/verifier/reward.txt or reward.json"),
        ("echo nan > /logs/verifier/reward.txt", "reward.txt: expected a finite number"),
        (
            "echo '{}' > /logs/verifier/reward.json",
            "reward.json: expected a flat JSON object of numbers, got {}",
        ),
    ],
)
def test_unusable_reward_is_a_verifier_error(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    test_script: str,
    expected: str,
) -> None:
    make_task("broken", test=test_script)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')

    result = pytester.runpytest("--hemra-run", str(run_file))

    result.assert_outcomes(failed=1)  # the agent's result, scored 0: never dropped
    result.stdout.fnmatch_lines([f"*verifier_error (no reward, scored 0): {expected}*"])
    (row,) = run_rows(pytester.path / ".hemra" / "hemra.db")
    assert row["outcome"] == "verifier_error" and expected in row["error"]


def test_crashing_harness_is_a_harness_error_and_still_verified(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    make_task("crash")
    write_harness(
        "crasher",
        'kind = "program"\ncommand = ["bash", "-c", "echo hi > out.txt; echo boom >&2; exit 3"]\n',
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["crasher"]\ndatasets = ["ds"]\n')

    result = pytester.runpytest("--hemra-run", str(run_file))

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*harness_error (reward 1, exit code 3)*"])
    (row,) = run_rows(pytester.path / ".hemra" / "hemra.db")
    assert (row["outcome"], row["reward"], row["exit_code"]) == ("harness_error", 1.0, 3)
    assert (Path(row["trial_dir"]) / "agent" / "stderr.txt").read_text() == "boom\n"


def test_task_image_is_built_once_per_environment_content(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    docker_client: Any,
) -> None:
    marker = secrets.token_hex(8)  # a fresh environment: resolve must build it
    make_task("cached", dockerfile=f"FROM debian:bookworm-slim\nRUN echo {marker} > /marker\n")
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\nattempts = 2\n')

    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=2)

    built = [
        i
        for i in docker_client.images.list(filters={"label": "hemra.task=cached"})
        if any(t.startswith("hemra-task:") for t in i.tags)
    ]
    phases = [json.loads(r["phases"]) for r in run_rows(pytester.path / ".hemra" / "hemra.db")]
    assert len(built) >= 1
    assert all(p["image"] < 0.5 for p in phases)  # built at resolve, found cached by each trial


def test_agent_diff_is_kept_in_the_trial_folder(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
) -> None:
    make_task(
        "diffed",
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\n"
        "RUN echo old > keep.txt && echo gone > gone.txt\n",
        solve="echo new > keep.txt; rm gone.txt; echo hi > out.txt",
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')

    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=1)

    (row,) = run_rows(pytester.path / ".hemra" / "hemra.db")
    diff = (Path(row["trial_dir"]) / "diff.patch").read_text()
    assert "-old\n+new\n" in diff
    assert "--- a/gone.txt\n+++ /dev/null" in diff
    assert "+++ b/out.txt" in diff
    result = json.loads((Path(row["trial_dir"]) / "result.json").read_text())
    assert result["schema_version"] == 2 and result["outcome"] == "pass"


@pytest.mark.slow
def test_every_trial_of_an_image_diffs_against_it_and_agent_logs_are_kept_when_written(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    """Four trials of one image in one process: the first reads its /app, the others are
    given the snapshot kept for the image; every diff is against the image's /app all the same.
    /logs/agent is read back only when the harness left something there (the sweep says)."""
    make_task(
        "diffed",
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\n"
        "RUN echo old > keep.txt && echo gone > gone.txt\n",
        solve="echo new > keep.txt; rm gone.txt; echo hi > out.txt",
    )
    write_harness(
        "logger",
        """\
        kind = "program"
        command = ["bash", "-c", '''bash /solution/solve.sh && cd /logs/agent
          echo {} > run.json && echo x > .seen''']
        uses_solution = true
    """,
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle", "logger"]\ndatasets = ["ds"]\nattempts = 2\n')

    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=4)

    rows = run_rows(pytester.path / ".hemra" / "hemra.db")
    diffs = {(Path(row["trial_dir"]) / "diff.patch").read_text() for row in rows}
    (diff,) = diffs
    assert "-old\n+new\n" in diff and "--- a/gone.txt\n+++ /dev/null" in diff
    for row in rows:
        logs = Path(row["trial_dir"]) / "agent" / "logs"
        kept = sorted(p.name for p in logs.iterdir()) if logs.is_dir() else []
        assert kept == ([".seen", "run.json"] if row["harness"] == "logger" else []), row


def test_hemra_run_works_with_flags_alone(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
) -> None:
    make_task("one")
    make_task("two")
    result = pytester.run(
        "hemra",
        "run",
        "-H",
        "oracle",
        "-H",
        "nop",
        "-d",
        str(tmp_path / "datasets" / "ds"),
        "-t",
        "o*",
        "--attempts",
        "2",
        "--baseline",
        "nop",
        "--store",
        str(tmp_path / "s.db"),
    )
    assert result.ret == 0  # nop failing is a result, not an unfinished cell
    found = outcomes(tmp_path / "s.db")
    assert sorted(found) == [
        "ds::one[nop-1]",
        "ds::one[nop-2]",
        "ds::one[oracle-1]",
        "ds::one[oracle-2]",
    ]
    result.stdout.fnmatch_lines(["nop (baseline)*2/2*", "oracle*2/2*2*"])


def test_hemra_run_exits_non_zero_when_a_cell_did_not_finish(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
) -> None:
    make_task("broken", test="true")
    result = pytester.run(
        "hemra",
        "run",
        "-H",
        "oracle",
        "-d",
        str(tmp_path / "datasets" / "ds"),
        "--store",
        str(tmp_path / "s.db"),
    )
    assert result.ret == 1
    assert outcomes(tmp_path / "s.db") == {"ds::broken[oracle-1]": ("verifier_error", 0.0)}


def test_verifier_past_its_timeout_is_a_verifier_error(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("stuck", test="sleep 60", task_toml="[verifier]\ntimeout_sec = 1\n")
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(failed=1)
    (row,) = run_rows(pytester.path / ".hemra" / "hemra.db")
    assert row["outcome"] == "verifier_error" and "1s timeout" in row["error"]
    assert row["reward"] == 0.0


def test_xdist_workers_run_the_recorded_plan_and_deselection_is_recorded(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    for name in ("one", "two", "three"):
        make_task(name)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle", "nop"]\ndatasets = ["ds"]\n')
    junit = tmp_path / "junit.xml"

    result = pytester.runpytest(
        "--hemra-run", str(run_file), "-n", "2", "-k", "not three", f"--junitxml={junit}"
    )

    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["oracle (baseline)*2/2*2*", "nop*2/2*0*"])
    rows = {r["item_id"]: r for r in run_rows(pytester.path / ".hemra" / "hemra.db")}
    assert {i for i, r in rows.items() if r["status"] == "deselected"} == {
        "ds::three[oracle-1]",
        "ds::three[nop-1]",
    }
    assert len({r["worker"] for r in rows.values() if r["worker"]}) == 2
    assert len(list(ET.parse(junit).getroot().iter("testcase"))) == 4


def test_secret_values_reach_the_harness_but_never_the_store_or_trial_folder(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sentinel = "sentinel-value-8d41c2"
    monkeypatch.setenv("HEMRA_SENTINEL_KEY", sentinel)
    make_task("secret", test="[ -s /app/out.txt ] && echo 1 > /logs/verifier/reward.txt")
    write_harness(
        "keyed",
        """\
        kind = "program"
        env = ["HEMRA_SENTINEL_KEY"]
        command = ["bash", "-c", 'printf %s "$HEMRA_SENTINEL_KEY" | wc -c > out.txt']
    """,
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["keyed"]\ndatasets = ["ds"]\n[verifier]\nenv = ["HEMRA_SENTINEL_KEY"]\n'
    )

    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=1)

    written = [p for p in (pytester.path / ".hemra").rglob("*") if p.is_file()]
    assert any(p.name == "hemra.db" for p in written)
    for path in written:
        try:
            content = path.read_bytes()
        except FileNotFoundError:  # SQLite's -shm or -wal, gone as its last handle closed
            continue
        assert sentinel.encode() not in content, path
    connection = sqlite3.connect(pytester.path / ".hemra" / "hemra.db")
    (spec,) = connection.execute("SELECT spec FROM runs").fetchone()
    connection.close()
    assert "HEMRA_SENTINEL_KEY" in spec  # the name is recorded, never the value


@pytest.mark.slow
def test_hemra_run_takes_concurrency_from_the_run_file(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    for name in ("one", "two"):
        make_task(name)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle", "nop"]\ndatasets = ["ds"]\nconcurrency = 2\n')
    result = pytester.run("hemra", "run", str(run_file))
    assert result.ret == 0
    rows = run_rows(pytester.path / ".hemra" / "hemra.db")
    assert [r["status"] for r in rows] == ["finished"] * 4
    assert len({r["worker"] for r in rows}) == 1  # one process, its lanes
    spans = [(r["started_at"], r["finished_at"]) for r in rows]
    assert max(sum(1 for s, f in spans if s <= start < f) for start, _ in spans) == 2


def test_trials_of_two_datasets_finishing_interleaved_are_reported_without_errors(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    """a/quick finishes, then b/middle, then a/slow: each item is set up under its own dataset
    although the item run after it is another dataset's (a cancel's trials, too, finish in any
    order); pytest's setup state said 'previous item was not torn down properly'."""
    for dataset, name, seconds in [("a", "quick", 0), ("a", "slow", 8), ("b", "middle", 3)]:
        make_task(name, dataset=dataset, solve=f"sleep {seconds}; echo hi > /app/out.txt")
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["a", "b"]\nconcurrency = 3\n')

    result = pytester.runpytest("--hemra-run", str(run_file))

    result.assert_outcomes(passed=3)
    assert "not torn down properly" not in result.stdout.str()
