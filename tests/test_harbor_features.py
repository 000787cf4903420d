"""The bundled `harbor-features` dataset: each honoured task.toml key at work in a real trial."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import TaskMaker
from pytest_hemra.resolve.datasets import bundled_dir


def rows(store: Path) -> dict[str, dict[str, Any]]:
    connection = sqlite3.connect(store)
    connection.row_factory = sqlite3.Row
    found = {r["item_id"]: dict(r) for r in connection.execute("SELECT * FROM trials")}
    steps = connection.execute("SELECT trial_id, name, reward, error FROM steps ORDER BY seq")
    by_trial: dict[str, list[tuple[str, float, str | None]]] = {}
    for trial_id, name, reward, error in steps:
        by_trial.setdefault(trial_id, []).append((name, reward, error))
    connection.close()
    for row in found.values():
        row["steps"] = by_trial.get(row["id"], [])
    return found


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_oracle_passes_and_nop_fails_every_harbor_features_task(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEMRA_FEATURE_GREETING", "hi from the runner")
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle", "nop"]\ndatasets = ["harbor-features"]\n'
        '[sandbox]\npass_env = ["HEMRA_FEATURE_GREETING"]\n'
    )
    store = tmp_path / "hemra.db"
    result = pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store))

    found = rows(store)
    tasks = [path for path in bundled_dir("datasets").joinpath("harbor-features").iterdir()]
    tasks = [path for path in tasks if (path / "task.toml").is_file()]
    assert len(found) == 2 * len(tasks)
    for item, row in found.items():
        expected = ("pass", 1.0) if "[oracle-1]" in item else ("fail", 0.0)
        assert (row["outcome"], row["reward"]) == expected, (item, row["error"])
    result.assert_outcomes(passed=len(tasks), failed=len(tasks))

    def folder(task: str, harness: str) -> Path:
        return Path(found[f"harbor-features::{task}[{harness}-1]"]["trial_dir"])

    # [environment] env, its template filled from a runner variable the run passes
    assert (
        "+hi from the runner swordfish" in (folder("task-env", "oracle") / "diff.patch").read_text()
    )
    # the verifier as the image's USER (dev, uid 1500), the room handed to it
    assert (folder("verifier-user", "oracle") / "verifier" / "user.txt").read_text() == (
        "1500:1500 (image)\n"
    )
    # the workdir's diff
    assert "+++ b/where.txt" in (folder("workdir", "oracle") / "diff.patch").read_text()
    # artifacts: a folder, and a file with a destination; the manifest
    artifacts = folder("health-artifacts", "oracle") / "artifacts"
    assert (artifacts / "app" / "report" / "summary.txt").read_text() == "done\n"
    assert json.loads((artifacts / "summary" / "final.json").read_text()) == {"ok": True}
    manifest = json.loads((artifacts / "manifest.json").read_text())
    assert [(m["source"], m["files"]) for m in manifest] == [
        ("/app/report", 1),
        ("/app/summary.json", 1),
    ]
    assert (folder("health-artifacts", "oracle") / "healthcheck.txt").exists()
    # min_reward: nop falls short on the first step, the second is skipped: no reward, left
    # out of the mean (Harbor's rule), so the trial's reward is the first step's
    nop_steps = found["harbor-features::gated-steps[nop-1]"]["steps"]
    assert [(name, reward) for name, reward, _ in nop_steps] == [("fix", 0.0), ("extend", None)]
    assert (nop_steps[1][2] or "").startswith("skipped: step fix scored below its min_reward")
    oracle_steps = found["harbor-features::gated-steps[oracle-1]"]["steps"]
    assert [(name, reward, error) for name, reward, error in oracle_steps] == [
        ("fix", 1.0, None),
        ("extend", 1.0, None),
    ]
    # several metrics and no `reward` key: every key kept, the trial's reward the lowest
    for harness, value in (("oracle", 1.0), ("nop", 0.0)):
        row = found[f"harbor-features::multi-metric[{harness}-1]"]
        assert json.loads(row["rewards"]) == {"correctness": value, "performance": value}
    # "final": the last step's keys are the trial's; for nop, the last that ran (the second
    # was skipped)
    final = {h: found[f"harbor-features::final-keys[{h}-1]"] for h in ("oracle", "nop")}
    assert json.loads(final["oracle"]["rewards"]) == {"reward": 1.0, "sorted": 1.0}
    assert json.loads(final["nop"]["rewards"]) == {"reward": 0.0, "words": 0.0}
    assert [(name, reward) for name, reward, _ in final["nop"]["steps"]] == [
        ("draft", 0.0),
        ("polish", None),
    ]


@pytest.mark.usefixtures("docker_test")
def test_an_unhealthy_sandbox_is_an_infra_error_naming_its_healthcheck(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task(
        "unhealthy",
        task_toml="[environment.healthcheck]\n"
        'command = "echo not yet; false"\ninterval_sec = 0.1\nretries = 2\n',
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    pytester.runpytest("--hemra-run", str(run_file))
    connection = sqlite3.connect(pytester.path / ".hemra" / "hemra.db")
    ((outcome, error),) = connection.execute("SELECT outcome, error FROM trials").fetchall()
    connection.close()
    assert outcome == "infra_error"
    assert "healthcheck failed 2 times in a row (exit 1: not yet" in error


@pytest.mark.usefixtures("docker_test")
def test_a_verifier_that_failed_for_lack_of_a_network_is_classed_and_flagged(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    failing = "echo 0 > /logs/verifier/reward.txt"
    offline = "echo 'curl: (6) Could not resolve host: files.example.invalid' >&2; " + failing
    make_task("offline", test=offline)
    make_task("public", test=offline, task_toml='[verifier]\nnetwork_mode = "public"\n')
    make_task("plain", test="echo 'assertion failed' >&2; " + failing)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    connection = sqlite3.connect(pytester.path / ".hemra" / "hemra.db")
    classes = dict(connection.execute("SELECT task, cause FROM trials").fetchall())
    connection.close()
    # only where the network was cut: a task whose verifier kept it failed for its own reasons
    assert classes == {"offline": "verifier_offline", "public": None, "plain": None}
    result.stdout.fnmatch_lines(
        ["! oracle: 1 trial failed in a verifier that tried to reach the network*(offline)*"]
    )


@pytest.mark.usefixtures("docker_test")
def test_artifacts_an_agent_plants_are_bounded_and_never_follow_links(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    """A cheating agent fills a declared artifact folder with a link to a root-only file, a link
    out of the folder and a huge sparse file: the trial folder gets neither the linked content
    nor the huge file (named in the manifest as skipped), and the trial ends normally."""
    secret = "root-only-secret-5b1e"
    make_task(
        "planted",
        dockerfile=f"FROM debian:bookworm-slim\nWORKDIR /app\nRUN echo {secret} > /secret.txt"
        " && chmod 600 /secret.txt\nUSER 1000\n",
        task_toml='artifacts = ["/app/out"]\n',
        solve="mkdir -p /app/out && ln -s /secret.txt /app/out/secret && ln -s / /app/out/root"
        " && truncate -s 20G /app/out/huge && echo hi > /app/out.txt && echo ok > /app/out/ok",
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=1)
    (row,) = rows(pytester.path / ".hemra" / "hemra.db").values()
    artifacts = Path(row["trial_dir"]) / "artifacts"
    copied = sorted(
        p.relative_to(artifacts).as_posix() for p in artifacts.rglob("*") if p.is_file()
    )
    assert copied == ["app/out/ok", "manifest.json"]
    (entry,) = json.loads((artifacts / "manifest.json").read_text())
    assert entry["skipped"] == {"huge": 20 << 30}
    folder = Path(row["trial_dir"])
    assert not any(
        secret in p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file()
    )
