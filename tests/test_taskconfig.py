"""Every key of Harbor's task.toml is honoured or refused by name; unknown keys warn."""

from __future__ import annotations

import json
import sqlite3
import tomllib
from pathlib import Path
from typing import Any

import pytest

from conftest import TaskMaker
from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import load_task
from pytest_hemra.resolve.env_templates import render_env, template_names

EVERY_HONOURED_KEY = """\
schema_version = "1.4"
source = "https://example.invalid/tasks"
multi_step_reward_strategy = "final"
artifacts = ["/app/out", { source = "/app/x.json", destination = "x/y.json", exclude = ["*.tmp"] }]

[task]
name = "org/every-key"
version = "1.0.0"
description = "every key"
authors = [{ name = "A", email = "a@example.invalid" }]
keywords = ["k"]

[metadata]
anything = { goes = "here" }

[agent]
timeout_sec = 60
user = "app"
network_mode = "public"

[verifier]
timeout_sec = 60
env = { TOKEN = "${HEMRA_TEST_TOKEN:-none}" }
user = "root"
network_mode = "no-network"
environment_mode = "shared"
continuous = { enabled = false }

[environment]
build_timeout_sec = 300
os = "Linux"
cpus = 1
memory = "1G"
storage_mb = 2048
gpus = 0
allow_internet = false
env = { GREETING = "hi" }
workdir = "/work"
healthcheck = { command = "true", interval_sec = 1, retries = 2 }
mcp_servers = [
  { name = "docs", transport = "http", url = "http://docs:8000/mcp" },
  { name = "tools", transport = "stdio", command = "tools-server", args = ["--quiet"] },
]

[solution]
env = { WORD = "x" }
"""


def test_every_honoured_key_of_schema_1_4_loads(make_task: TaskMaker) -> None:
    task = load_task(make_task("every", task_toml=EVERY_HONOURED_KEY))
    config = task.config
    assert task.warnings == ()
    assert config.schema_version == "1.4" and config.task and config.task.name == "org/every-key"
    assert config.environment.memory_mb == 1024 and config.environment.storage_mb == 2048
    assert config.environment.workdir == "/work" and not config.environment.has_internet
    assert config.environment.healthcheck and config.environment.healthcheck.retries == 2
    assert config.artifact_paths == ["/app/out", "/app/x.json"]
    assert config.verifier.network_mode == "no-network"


def test_schema_1_0_calls_it_version(make_task: TaskMaker) -> None:
    task = load_task(
        make_task("old", task_toml='version = "1.0"\n[environment]\nmemory = "512M"\n')
    )
    assert task.config.schema_version == "1.0"
    assert task.config.environment.memory_mb == 512


@pytest.mark.parametrize(
    ("task_toml", "expected"),
    [
        ('schema_version = "2.0"\n', "key 'schema_version': expected one of 1.0, 1.1"),
        ('[environment]\nos = "windows"\n', "key 'environment.os': HEMRA runs Linux containers"),
        ("[environment]\ngpus = 1\n", "key 'environment.gpus': 1 GPUs asked for"),
        ('[environment.tpu]\ntype = "v6e"\ntopology = "2x2"\n', "key 'environment.tpu': a TPU"),
        (
            '[[environment.mcp_servers]]\nname = "m"\ntransport = "stdio"\n',
            "key 'environment.mcp_servers[0]': 'command' is required for transport 'stdio'",
        ),
        ('[environment]\nskills_dir = "skills"\n', "key 'environment.skills_dir': string should"),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["https://pypi.org"]\n',
            "key 'environment.allowed_hosts': 'https://pypi.org' is not a host",
        ),
        ('[agent]\nuser = "a b"\n', "key 'agent.user': expected a user name or uid"),
        ('[verifier]\nuser = "a b"\n', "key 'verifier.user': expected a user name or uid"),
        (
            '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 2\n',
            "key 'verifier': environment_mode = 'shared' with a",
        ),
        ("[verifier.continuous]\nenabled = true\n", "key 'verifier.continuous.enabled'"),
        ('[[verifier.collect]]\ncommand = "x"\n', "key 'verifier.collect': collect hooks"),
        ('[environment]\nenv = { "1X" = "y" }\n', "key 'environment.env': '1X' is not an env"),
        ('[[steps]]\nname = "s"\nmin_reward = "high"\n', "key 'steps[0].min_reward"),
        ('artifacts = ["relative/path"]\n', "key 'artifacts': expected an absolute path"),
    ],
)
def test_what_hemra_cannot_do_is_refused_naming_the_key(
    make_task: TaskMaker, task_toml: str, expected: str
) -> None:
    folder = make_task("refused", task_toml=task_toml)
    with pytest.raises(SpecError) as raised:
        load_task(folder)
    message = str(raised.value)
    assert message.startswith(f"{folder / 'task.toml'}: ") and "\n" not in message
    assert expected.lower() in message.lower(), message


def test_a_compose_file_is_parsed_with_its_services_in_dependency_order(
    make_task: TaskMaker,
) -> None:
    folder = make_task("compose")
    (folder / "environment" / "db").mkdir()
    (folder / "environment" / "db" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    (folder / "environment" / "docker-compose.yaml").write_text(
        "services:\n"
        "  main:\n    depends_on: [api]\n    environment: [MODE=test]\n"
        "  api:\n    image: debian:bookworm-slim\n    command: sleep $$HOME 1\n"
        "    depends_on: {db: {condition: service_healthy}}\n"
        "    healthcheck: {test: 'true', interval: 1m30s, start_period: 500ms}\n"
        "  db:\n    build: {context: db, args: {A: 1}}\n    environment: {B: '${X:-y}'}\n"
    )
    compose = load_task(folder).compose
    assert compose is not None
    assert compose.order() == ["db", "api"]
    assert compose.main.environment == {"MODE": "test"}
    assert {n: d.condition for n, d in compose.main.needed().items()} == {"api": "service_started"}
    api = compose.services["api"]
    assert api.command == ["sleep", "$HOME", "1"]
    assert api.healthcheck is not None
    assert (api.healthcheck.interval, api.healthcheck.start_period) == (90.0, 0.5)
    assert compose.services["db"].build is not None
    assert compose.services["db"].build.args == {"A": "1"}


@pytest.mark.parametrize(
    ("compose", "expected"),
    [
        ("services:\n  a:\n    image: x\n    cap_add: [NET_ADMIN]\n", "'a': key 'cap_add'"),
        ("services:\n  a:\n    image: x\n    network_mode: host\n", "key 'network_mode'"),
        ("services:\n  a: {}\n", "'a': key 'build' or 'image' is required"),
        ("services:\n  a:\n    build: ../..\n", "outside the compose file's folder"),
        ("services:\n  a:\n    image: x\n    depends_on: [b]\n", "no service named 'b'"),
        ("services:\n  main:\n    image: other\n", "'main': key 'image'"),
        (
            "services:\n  a: {image: x, depends_on: [b]}\n  b: {image: x, depends_on: [a]}\n",
            "a cycle",
        ),
        ("networks: {}\n", "top-level key 'networks'"),
        ("services: [\n", "not valid YAML"),
    ],
)
def test_what_a_compose_file_may_not_say_is_refused_naming_file_service_and_key(
    make_task: TaskMaker, compose: str, expected: str
) -> None:
    folder = make_task("compose")
    path = folder / "environment" / "docker-compose.yaml"
    path.write_text(compose)
    with pytest.raises(SpecError) as raised:
        load_task(folder)
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert expected in message, message


def test_unknown_keys_are_warnings_naming_each(make_task: TaskMaker) -> None:
    task = load_task(
        make_task(
            "unknown",
            task_toml='flavour = "x"\n[environment]\ncpu = 2\n[verifier.continuous]\nfoo = 1\n',
        )
    )
    assert sorted(w.split(": ", 1)[1] for w in task.warnings) == [
        "key 'environment.cpu' is not one of Harbor's task keys (ignored)",
        "key 'flavour' is not one of Harbor's task keys (ignored)",
        "key 'verifier.continuous.foo' is not one of Harbor's task keys (ignored)",
    ]


def test_env_templates_read_the_runner_environment() -> None:
    env = {"A": "${ONE}-${TWO:-two}", "B": "plain"}
    assert template_names(env) == {"ONE": False, "TWO": True}
    assert render_env(env, {"ONE": "1"}) == {"A": "1-two", "B": "plain"}
    assert render_env(env, {"ONE": "1", "TWO": "2"}) == {"A": "1-2", "B": "plain"}


def run_file_for(tmp_path: Path) -> Path:
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    return run_file


def test_an_unknown_key_is_shown_and_the_run_goes_ahead(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("warned", task_toml="[environment]\ncpu = 2\n")
    result = pytester.runpytest("--hemra-run", str(run_file_for(tmp_path)), "--collect-only")
    result.stdout.fnmatch_lines(["*InputWarning*key 'environment.cpu' is not one of Harbor's*"])
    assert result.ret == pytest.ExitCode.OK


@pytest.mark.parametrize(
    ("task_toml", "expected"),
    [
        (
            '[environment]\nenv = { K = "${ANTHROPIC_API_KEY}" }\n',
            "key 'environment.env': ${ANTHROPIC_API_KEY} is a model provider's key",
        ),
        (
            '[verifier]\nenv = { K = "${OPENAI_API_KEY:-none}" }\n',
            "key 'verifier.env': ${OPENAI_API_KEY} is a model provider's key",
        ),
        (
            '[solution]\nenv = { K = "${HEMRA_SURELY_UNSET_VARIABLE}" }\n',
            "key 'solution.env': ${HEMRA_SURELY_UNSET_VARIABLE} reads runner variable"
            " HEMRA_SURELY_UNSET_VARIABLE, which the run does not pass to sandboxes: add it to",
        ),
    ],
)
def test_task_env_is_checked_at_resolve_and_nothing_is_recorded(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    monkeypatch: pytest.MonkeyPatch,
    task_toml: str,
    expected: str,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-sentinel-task-env")
    monkeypatch.delenv("HEMRA_SURELY_UNSET_VARIABLE", raising=False)
    make_task("env", task_toml=task_toml)
    result = pytester.runpytest("--hemra-run", str(run_file_for(tmp_path)))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{expected}*"])
    store = pytester.path / ".hemra" / "hemra.db"
    if store.exists():
        connection = sqlite3.connect(store)
        assert connection.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        connection.close()


def test_mcp_servers_are_rendered_for_each_harness_format(make_task: TaskMaker) -> None:
    from pytest_hemra.execute.mcp import acp_servers, claude_json, codex_toml

    servers = load_task(
        make_task("mcp", task_toml=EVERY_HONOURED_KEY)
    ).config.environment.mcp_servers
    assert json.loads(claude_json(servers)) == {
        "mcpServers": {
            "docs": {"type": "http", "url": "http://docs:8000/mcp"},
            "tools": {"command": "tools-server", "args": ["--quiet"]},
        }
    }
    assert tomllib.loads(codex_toml(servers)) == {
        "mcp_servers": {
            "docs": {"url": "http://docs:8000/mcp"},
            "tools": {"command": "tools-server", "args": ["--quiet"]},
        }
    }
    assert [s.get("type", "stdio") for s in acp_servers(servers)] == ["http", "stdio"]


def test_a_harness_that_cannot_take_mcp_servers_is_named(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, write_harness: Any
) -> None:
    make_task("mcp", task_toml='[[environment.mcp_servers]]\nname = "m"\nurl = "http://m/"\n')
    write_harness("plain", 'kind = "program"\nprovider = "anthropic"\ncommand = ["true"]\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["plain", "oracle"]\nmodel = "hemra/scripted"\ndatasets = ["ds"]\n'
    )
    result = pytester.runpytest("--hemra-run", str(run_file), "--collect-only")
    result.stdout.fnmatch_lines(["*InputWarning*harness 'plain' is not handed MCP servers*: mcp"])
    assert "harness 'oracle'" not in result.stdout.str()
