"""Real coding-agent CLIs from npm and PyPI, installed once, in real Docker sandboxes, offline."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, TaskMaker
from pytest_hemra.execute.gateway.scripted import EditsStep, load_edits, scripted_usage, whole_files
from pytest_hemra.execute.gateway.wire import Wire
from pytest_hemra.execute.installs import MARKER, install_dir, is_installed
from pytest_hemra.resolve.datasets import bundled_dir
from pytest_hemra.resolve.harnesses import resolve_harness
from pytest_hemra.store import Store
from tests.upstream import running_upstream

pytestmark = [pytest.mark.usefixtures("docker_test"), pytest.mark.slow]  # real agents, installed
WIRE_OF = {
    "claude-code": Wire.ANTHROPIC,
    "codex": Wire.RESPONSES,
    "pi": Wire.CHAT,
    "claude-code-acp": Wire.ANTHROPIC,
    "mini-swe-agent": Wire.CHAT,
    "aider": Wire.CHAT,
}
EDIT_FORMAT = {"aider"}  # no tools: one reply holding the task's files whole, then it exits
NO_OWN_NUMBERS = {"claude-code-acp"}  # ACP carries no usage
# aider streams, as its users run it, and reads no usage from a stream: the counts it prints are
# its tokenizer's estimates (the gateway's count, asked of the upstream, is the one that holds)
ESTIMATED_OWN_NUMBERS = {"aider"}
STREAMED_WITHOUT_USAGE_ASKED = {"aider"}  # LiteLLM sends no stream_options unless told to
SENTINEL = "sk-sentinel-7e21d4a9c0"


# Two of hemra-offline's six tasks keep the suite's time down (each real agent's trial costs
# seconds): a test verifier, and several files edited at once (aider's reply holds them whole).
# Every task is solved by every real agent when the example runs as its header says.
REAL_AGENT_TASKS = ("fix-test", "multi-file-refactor")


def test_real_agents_solve_offline_tasks_counted_to_the_token(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    store_path = tmp_path / "s.db"
    result = pytester.runpytest(
        "--hemra-run",
        str(REPO / "examples" / "offline-harnesses.toml"),
        "--hemra-store",
        str(store_path),
        "-k",
        " or ".join(REAL_AGENT_TASKS),
    )
    dataset = bundled_dir("datasets") / "hemra-offline"
    tasks = len(REAL_AGENT_TASKS)
    result.assert_outcomes(passed=len(WIRE_OF) * tasks)
    store = Store(store_path)
    (run,) = store.runs()
    ran = [t for t in store.trials(run.id) if t.task in REAL_AGENT_TASKS]
    assert len(ran) == len(WIRE_OF) * tasks  # the others are recorded as not run (-k)
    for trial in ran:
        per_call = scripted_usage(WIRE_OF[trial.harness]).total_tokens
        calls = 1 if trial.harness in EDIT_FORMAT else 2  # else a tool call, then a final message
        assert trial.tokens == calls * per_call, trial.item_id
        own = trial.own_report
        if trial.harness in NO_OWN_NUMBERS:  # the gateway's count only
            assert own is None
        elif trial.harness in ESTIMATED_OWN_NUMBERS:
            assert own is not None and own["input_tokens"] > 0, trial.item_id
            assert own["is_estimate"], trial.item_id  # shown, never held against the gateway
        else:
            assert own is not None, trial.item_id
            own_total = sum(
                own[k]
                for k in (
                    "input_tokens",
                    "output_tokens",
                    "cache_read_tokens",
                    "cache_write_tokens",
                )
            )
            assert own_total == trial.tokens, trial.item_id
        calls_dir = Path(trial.trial_dir or "") / "calls"
        if trial.harness in STREAMED_WITHOUT_USAGE_ASKED:  # counted all the same, above
            for request in sorted(calls_dir.glob("*.request.json")):
                sent = json.loads(request.read_text())
                assert sent["stream"] is True and "stream_options" not in sent, trial.item_id
                got = request.with_name(request.name.replace("request.json", "response"))
                assert b"[DONE]" in got.read_bytes() and b"usage" not in got.read_bytes()
        trajectory = json.loads((Path(trial.trial_dir or "") / "trajectory.json").read_text())
        tools = [c["name"] for m in trajectory["messages"] for c in m.get("tool_calls", [])]
        last = trajectory["messages"][-1]
        assert last["role"] == "assistant", trial.item_id
        if trial.harness in EDIT_FORMAT:  # the task's files, whole, in one text reply
            (edits,) = load_edits(dataset / trial.task / "solution" / "edits.toml")
            assert isinstance(edits, EditsStep)
            assert not tools and last["text"] == whole_files(edits), trial.item_id
            continue
        # the solution's one command, and mini-swe-agent's finish_command after it
        assert len(tools) == (2 if trial.harness == "mini-swe-agent" else 1), tools
    result.stdout.fnmatch_lines([f"{name}*2/2*2*" for name in WIRE_OF])


@pytest.mark.parametrize("name", ["pi", "aider"])  # from npm, from PyPI
def test_installs_are_cached_by_harness_digest(pytester: pytest.Pytester, name: str) -> None:
    harness = resolve_harness(name, REPO, "test", None)
    first = pytester.run("hemra", "harness", "install", name)
    assert first.ret == 0 and is_installed(harness)
    marker = (install_dir(harness) / MARKER).stat().st_mtime_ns
    again = pytester.run("hemra", "harness", "install", name)
    assert f"{name}: already installed" in again.stdout.str()
    assert (install_dir(harness) / MARKER).stat().st_mtime_ns == marker


def test_an_install_that_fails_refuses_the_run_and_records_nothing(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    make_task("one")
    write_harness(
        "ghost",
        'kind = "cli"\ncommand = ["ghost"]\n'
        'package = "npm:@hemra-test-does-not-exist/ghost-agent@0.0.1"\n',
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["ghost"]\ndatasets = ["ds"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: *ghost.toml: installing npm:@hemra-test-does-not-exist* failed*"]
    )
    assert not (pytester.path / ".hemra").exists()


def test_claude_code_gets_the_real_key_only_at_the_upstream(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SENTINEL)
    with running_upstream() as upstream:
        run_file = tmp_path / "run.toml"
        run_file.write_text(
            'harnesses = ["claude-code"]\ndatasets = ["hemra-offline"]\ntasks = ["create-file"]\n'
            f'model = "claude-sonnet-4-5"\n[providers.anthropic]\nbase_url = "{upstream.url}"\n'
        )
        pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(failed=1)
        seen = list(upstream.seen)
    assert seen and all(s["headers"].get("x-api-key") == SENTINEL for s in seen)
    assert all("hemra-" not in str(s["headers"]) for s in seen)
    for path in (pytester.path / ".hemra").rglob("*"):
        if path.is_file():
            assert SENTINEL.encode() not in path.read_bytes(), path
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    (trial,) = store.trials(run.id)
    assert trial.tokens == len(seen) * 23 and trial.outcome == "fail"  # the upstream's usage


@pytest.mark.parametrize("name", ["claude-code", "codex", "claude-code-acp"])
def test_a_tasks_mcp_servers_reach_the_real_agent(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, name: str
) -> None:
    """A task's stdio MCP server is started by the agent itself (Claude Code through
    --mcp-config, Codex through its config.toml, the ACP agent through session/new): the
    server's command leaves a mark; the scripted model then solves the task as usual."""
    mark = "/tmp/mcp-started-by-the-agent"
    make_task(
        "with-mcp",
        task_toml="[agent]\ntimeout_sec = 120\n[[environment.mcp_servers]]\n"
        f'name = "marker"\ntransport = "stdio"\ncommand = "sh"\nargs = ["-c", "touch {mark}"]\n',
        test=f'if [ -e {mark} ] && [ "$(cat /app/out.txt)" = hi ]; then echo 1; else echo 0;'
        " fi > /logs/verifier/reward.txt",
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'harnesses = ["{name}"]\nmodel = "hemra/scripted"\ndatasets = ["ds"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    result.assert_outcomes(passed=1)
