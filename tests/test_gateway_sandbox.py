"""The gateway seen from a real sandbox: keys swapped outside, never inside."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, TaskMaker
from pytest_hemra.store import Store
from tests.upstream import running_upstream

SENTINEL = "sk-sentinel-0f3b7c55e1"
PYTHON_IMAGE = (
    "FROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y "
    "--no-install-recommends python3 && rm -rf /var/lib/apt/lists/*\nWORKDIR /app\n"
)


@pytest.mark.usefixtures("docker_test")
def test_real_key_reaches_the_upstream_but_never_the_sandbox_store_or_trial_folder(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SENTINEL)
    make_task(
        "ask",
        dockerfile=PYTHON_IMAGE,
        test="grep -rq hemra- /app && echo 1 > /logs/verifier/reward.txt || "
        "echo 0 > /logs/verifier/reward.txt",
    )
    (tmp_path / "harnesses").mkdir()
    shutil.copy(
        REPO / "examples" / "scripted-agent" / "harnesses" / "mini-agent.toml",
        tmp_path / "harnesses",
    )
    write_harness(
        "env-dump",
        """\
        kind = "program"
        command = ["bash", "-c", '''env > /app/env.txt
        grep -rl sk-sentinel / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev \\
          2>/dev/null | wc -l > /app/leaks.txt''']
        """,
    )
    run_file = tmp_path / "run.toml"
    with running_upstream() as upstream:
        run_file.write_text(
            'harnesses = ["mini-agent", "env-dump"]\ndatasets = ["ds"]\n'
            'model = "claude-sonnet-4-5"\n'
            f'[providers.anthropic]\nbase_url = "{upstream.url}"\n'
        )
        result = pytester.runpytest("--hemra-run", str(run_file))
        seen = list(upstream.seen)

    result.assert_outcomes(passed=1, failed=1)  # env-dump left the per-trial token in /app
    assert [s["headers"]["x-api-key"] for s in seen] == [SENTINEL]
    assert all("hemra-" not in str(s["headers"]) for s in seen)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    (call,) = store.calls(run_id=run.id)
    assert (call.provider, call.status, call.input_tokens) == ("anthropic", 200, 11)
    written = [p for p in (pytester.path / ".hemra").rglob("*") if p.is_file()]
    for path in written:
        assert SENTINEL.encode() not in path.read_bytes(), path
    dumped = next(p for p in written if p.name == "diff.patch" and "env-dump" in str(p))
    assert "+HEMRA_API_KEY=hemra-" in dumped.read_text()
    assert "ANTHROPIC_API_KEY" not in dumped.read_text()
    assert "+++ b/leaks.txt\n@@ -0,0 +1 @@\n+0\n" in dumped.read_text()  # no file holds it


@pytest.mark.usefixtures("docker_test")
def test_an_upstream_unreachable_for_the_whole_trial_is_an_infra_error(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("ask", dockerfile=PYTHON_IMAGE)
    (tmp_path / "harnesses").mkdir()
    shutil.copy(
        REPO / "examples" / "scripted-agent" / "harnesses" / "mini-agent.toml",
        tmp_path / "harnesses",
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["mini-agent"]\ndatasets = ["ds"]\nmodel = "claude-sonnet-4-5"\n'
        '[providers.anthropic]\nbase_url = "http://127.0.0.1:9"\n'
    )
    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(errors=1)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    (trial,) = store.trials(run.id)
    assert trial.outcome == "infra_error" and "unreachable" in (trial.error or "")
    (call,) = store.calls(run_id=run.id)
    assert call.status == 502 and (call.error or "").startswith("upstream unreachable")


@pytest.mark.usefixtures("docker_test")
def test_a_scripted_transcript_can_play_a_wrong_fix(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    task = make_task("wrong", dockerfile=PYTHON_IMAGE)
    (task / "solution" / "scripted.toml").write_text(
        '[[step]]\nkind = "shell"\ncommand = "echo hello > /app/out.txt"\n\n'
        '[[step]]\nkind = "text"\ntext = "Fixed it, I think."\n'
    )
    (tmp_path / "harnesses").mkdir()
    shutil.copy(
        REPO / "examples" / "scripted-agent" / "harnesses" / "mini-agent.toml",
        tmp_path / "harnesses",
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["mini-agent"]\ndatasets = ["ds"]\nmodel = "hemra/scripted"\n')

    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(failed=1)

    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    (trial,) = store.trials(run.id)
    assert (trial.outcome, trial.reward) == ("fail", 0.0)
    assert len(store.calls(run_id=run.id)) == 2
    assert "+hello" in (Path(trial.trial_dir or "") / "diff.patch").read_text()
