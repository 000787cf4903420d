"""A task's env templates (`${VAR}`) read only the runner variables the run passes by name
(`[sandbox] pass_env`), and never a model provider's key, whatever its name: the sentinel tests."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, TaskMaker

SENTINEL = "sentinel-pass-env-6c1e93"
VARIABLE = "HEMRA_TEST_SENTINEL_XYZ"  # a name no provider or harness uses
UNLISTED = "HEMRA_TEST_UNLISTED_XYZ"


def nothing_recorded(pytester: pytest.Pytester, result: pytest.RunResult) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert not (pytester.path / ".hemra").exists()
    assert SENTINEL not in result.stdout.str() + result.stderr.str()


def one_error(result: pytest.RunResult) -> str:
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.errlines
    return errors[0]


def with_step(folder: Path) -> None:
    (folder / "steps" / "only").mkdir(parents=True)
    (folder / "steps" / "only" / "instruction.md").write_text("Write hi to /app/out.txt.\n")


def with_service(folder: Path) -> None:
    (folder / "environment" / "docker-compose.yaml").write_text(
        "services:\n  db:\n    image: debian:bookworm-slim\n"
        f"    environment: {{SEEN: '${{{VARIABLE}}}'}}\n"
    )


# each place a task.toml (or its compose file) holds env templates, and the key it is named by
LEVELS = {
    "environment": ('[environment]\nenv = { SEEN = "${%s}" }\n', None, "key 'environment.env'"),
    "solution": ('[solution]\nenv = { SEEN = "${%s}" }\n', None, "key 'solution.env'"),
    "verifier": ('[verifier]\nenv = { SEEN = "${%s}" }\n', None, "key 'verifier.env'"),
    "step-verifier": (
        '[[steps]]\nname = "only"\n[steps.verifier]\nenv = { SEEN = "${%s}" }\n',
        with_step,
        "key 'steps[0].verifier.env'",
    ),
    "compose-service": ("", with_service, "service 'db': key 'environment'"),
}


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_a_template_of_a_runner_variable_the_run_does_not_pass_is_refused_at_resolve(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    monkeypatch: pytest.MonkeyPatch,
    level: str,
) -> None:
    monkeypatch.setenv(VARIABLE, SENTINEL)
    task_toml, extra, key = LEVELS[level]
    folder = make_task("templated", task_toml=task_toml.replace("%s", VARIABLE))
    if extra is not None:
        extra(folder)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')

    result = pytester.runpytest("--hemra-run", str(run_file))

    nothing_recorded(pytester, result)
    error = one_error(result)
    assert f"{folder}/" in error and key in error, error  # the file and the key
    assert f"${{{VARIABLE}}} reads runner variable {VARIABLE}" in error
    assert f'add it to [sandbox] pass_env in {run_file} (pass_env = ["{VARIABLE}"])' in error


def test_a_passed_variable_that_is_unset_is_refused_naming_the_run_key(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    make_task("templated", task_toml=f'[environment]\nenv = {{ SEEN = "${{{VARIABLE}}}" }}\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'harnesses = ["oracle"]\ndatasets = ["ds"]\n[sandbox]\npass_env = ["{VARIABLE}"]\n'
    )
    result = pytester.runpytest("--hemra-run", str(run_file))
    nothing_recorded(pytester, result)
    assert (
        f"key 'environment.env': environment variable {VARIABLE} is not set (the run passes it:"
        f" [sandbox] pass_env in {run_file})"
    ) in one_error(result)


@pytest.mark.usefixtures("docker_test")
def test_a_passed_variable_reaches_the_sandbox_and_an_unpassed_one_is_its_default(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sentinel reaches the agent's and the verifier's env (the oracle writes what it saw,
    the verifier checks its own); a variable the run does not pass, though set on the runner,
    is the template's default in both; neither value is stored."""
    monkeypatch.setenv(VARIABLE, SENTINEL)
    monkeypatch.setenv(UNLISTED, "runner-only-4d7a")
    make_task(
        "templated",
        task_toml="[agent]\ntimeout_sec = 30\n"
        f'[environment]\nenv = {{ SEEN = "${{{VARIABLE}}}", OTHER = "${{{UNLISTED}:-default}}" }}\n'
        f'[verifier]\ntimeout_sec = 30\nenv = {{ CHECK = "${{{VARIABLE}}}" }}\n',
        solve='printf "%s %s\\n" "$SEEN" "$OTHER" > /app/seen.txt',
        test=f'if [ "$CHECK" = {SENTINEL} ] && [ "$(cat /app/seen.txt)" = "{SENTINEL} default" ]'
        "; then echo 1; else echo 0; fi > /logs/verifier/reward.txt",
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'harnesses = ["oracle"]\ndatasets = ["ds"]\n[sandbox]\npass_env = ["{VARIABLE}"]\n'
    )

    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=1)

    (patch,) = pytester.path.rglob("diff.patch")
    assert f"+{SENTINEL} default" in patch.read_text()
    assert "runner-only-4d7a" not in patch.read_text()
    database = pytester.path / ".hemra" / "hemra.db"
    connection = sqlite3.connect(database)
    (spec,) = connection.execute("SELECT spec FROM runs").fetchone()
    connection.close()
    assert VARIABLE in spec and SENTINEL not in spec  # names are recorded, never values


@pytest.mark.usefixtures("docker_test")
def test_hemra_check_passes_a_variable_by_name_and_refuses_the_task_without_it(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, SENTINEL)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    make_task(
        "templated",
        task_toml=f'[environment]\nenv = {{ SEEN = "${{{VARIABLE}}}" }}\n',
        solve='printf "%s" "$SEEN" > /app/out.txt',
        test=f'if [ "$(cat /app/out.txt)" = {SENTINEL} ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt",
    )
    dataset, store = str(tmp_path / "datasets" / "ds"), str(tmp_path / "s.db")

    refused = pytester.run("hemra", "check", dataset, "--store", store, timeout=240)
    assert refused.ret == 4
    assert f"add it to [sandbox] pass_env in a run file or pass --pass-env {VARIABLE}" in (
        refused.stderr.str()
    )
    assert not Path(store).exists()
    checked = pytester.run(
        "hemra", "check", dataset, "--pass-env", VARIABLE, "--store", store, timeout=240
    )
    assert checked.ret == 0, checked.errlines[-20:]
    checked.stdout.fnmatch_lines(["1 task: 1 healthy"])


KEY_SETUPS = {
    # a harness's key_env under an arbitrary name, listed in pass_env: the run file is refused
    "harness-key-listed": (
        'kind = "program"\nprovider = "anthropic"\nkey_env = "MY_CUSTOM_KEY"\ncommand = ["true"]\n',
        '[sandbox]\npass_env = ["MY_CUSTOM_KEY"]\n',
        "${MY_CUSTOM_KEY}",
        "run.toml: key 'sandbox.pass_env': MY_CUSTOM_KEY holds a model provider's key (the"
        " key_env of harness 'keyed'), which never enters a sandbox, listed in [sandbox]"
        " pass_env or not (the verifier runs code the agent left",
    ),
    # an upstream's key_env under an arbitrary name, templated with a default: the task is refused
    "upstream-key-with-default": (
        'kind = "program"\nprovider = "local"\ncommand = ["true"]\n',
        '[providers.local]\nbase_url = "http://127.0.0.1:9"\nkey_env = "MY_CUSTOM_KEY"\n',
        "${MY_CUSTOM_KEY:-none}",
        "task.toml: key 'verifier.env': ${MY_CUSTOM_KEY} is a model provider's key (the key_env"
        " of provider 'local'), which never enters a sandbox",
    ),
}


@pytest.mark.parametrize("setup", sorted(KEY_SETUPS))
def test_a_provider_key_under_any_name_never_fills_a_template_even_when_passed(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    setup: str,
) -> None:
    harness, run_extra, template, expected = KEY_SETUPS[setup]
    monkeypatch.setenv("MY_CUSTOM_KEY", SENTINEL)
    write_harness("keyed", harness)
    make_task("templated", task_toml=f'[verifier]\nenv = {{ KEY = "{template}" }}\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["keyed"]\nmodel = "hemra/scripted"\ndatasets = ["ds"]\n' + run_extra
    )
    result = pytester.runpytest("--hemra-run", str(run_file))
    nothing_recorded(pytester, result)
    assert expected in one_error(result)
