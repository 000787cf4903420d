"""Bad input is refused at resolve with one line naming the file and the problem; nothing is
recorded. Each case writes a run file (and whatever else it needs) and runs pytest on it."""

from __future__ import annotations

import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, TaskMaker
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.spec import RunSpec, load_run_spec

GOOD = 'harnesses = ["oracle", "nop"]\ndatasets = ["ds"]\n'


def nothing(tmp_path: Path, make_task: TaskMaker, write_harness: Callable[..., Path]) -> None:
    make_task("hello")


def harness(content: str) -> Callable[..., None]:
    def setup(tmp_path: Path, make_task: TaskMaker, write_harness: Callable[..., Path]) -> None:
        make_task("hello")
        write_harness("mine", content)

    return setup


def task(**changes: object) -> Callable[..., None]:
    def setup(tmp_path: Path, make_task: TaskMaker, write_harness: Callable[..., Path]) -> None:
        make_task("hello", **changes)  # type: ignore[arg-type]

    return setup


CASES = {
    "unknown-key": (
        GOOD + "attemps = 3\n",
        nothing,
        "run.toml: key 'attemps' is not a run setting (did you mean 'attempts'?)",
    ),
    "wrong-type": (
        GOOD + 'attempts = "three"\n',
        nothing,
        "run.toml: key 'attempts': input should be a valid integer, got 'three'",
    ),
    "zero-attempts": (GOOD + "attempts = 0\n", nothing, "key 'attempts': input should be greater"),
    "missing-harnesses": ('datasets = ["ds"]\n', nothing, "run.toml: key 'harnesses' is required"),
    "unknown-sandbox-key": (
        GOOD + '[sandbox]\nimag = "x"\n',
        nothing,
        "key 'sandbox.imag' is not a run setting (did you mean 'sandbox.image'?)",
    ),
    "not-toml": ("harnesses = [oracle\n", nothing, "run.toml: not valid TOML"),
    "unknown-harness": (
        'harnesses = ["oracel"]\ndatasets = ["ds"]\n',
        nothing,
        "run.toml: key 'harnesses': no harness named 'oracel'",
    ),
    "harness-path-traversal": (
        'harnesses = ["../evil"]\ndatasets = ["ds"]\n',
        nothing,
        "key 'harnesses': expected a name of letters",
    ),
    "duplicate-harness": (
        'harnesses = ["nop", "nop"]\ndatasets = ["ds"]\n',
        nothing,
        "key 'harnesses': expected each harness once",
    ),
    "harness-unknown-key": (
        'harnesses = ["mine"]\ndatasets = ["ds"]\n',
        harness('kind = "program"\ncommand = ["true"]\ncomand = ["x"]\n'),
        "mine.toml: key 'comand' is not a harness setting (did you mean 'command'?)",
    ),
    "harness-bad-kind": (
        'harnesses = ["mine"]\ndatasets = ["ds"]\n',
        harness('kind = "robot"\ncommand = ["true"]\n'),
        "mine.toml: key 'kind': input should be 'program'",
    ),
    "harness-kind-not-yet": (
        'harnesses = ["mine"]\ndatasets = ["ds"]\n',
        harness('kind = "computer-use"\ncommand = ["x"]\n'),
        "mine.toml: key 'kind': harness kind 'computer-use' is not supported yet",
    ),
    "harness-placeholder": (
        'harnesses = ["mine"]\ndatasets = ["ds"]\n',
        harness('kind = "program"\ncommand = ["run", "{instructions}"]\n'),
        "mine.toml: key 'command': unknown placeholder {instructions}",
    ),
    "harness-model-clash": (
        'harnesses = ["mine"]\ndatasets = ["ds"]\nmodel = "m1"\n',
        harness('kind = "program"\ncommand = ["true"]\nmodel = "m2"\n'),
        "mine.toml: key 'model': harness pins model 'm2' but the run",
    ),
    "harness-env-missing": (
        'harnesses = ["mine"]\ndatasets = ["ds"]\n',
        harness('kind = "program"\ncommand = ["true"]\nenv = ["HEMRA_TEST_UNSET_VARIABLE"]\n'),
        "mine.toml: key 'env': needs environment variable "
        "HEMRA_TEST_UNSET_VARIABLE, which is not set",
    ),
    "baseline-unknown": (
        GOOD + 'baseline = "codex"\n',
        nothing,
        "run.toml: key 'baseline': 'codex' is not one of the run's harnesses",
    ),
    "dataset-unknown": (
        'harnesses = ["nop"]\ndatasets = ["nope"]\n',
        nothing,
        "run.toml: key 'datasets': no dataset named 'nope'",
    ),
    "dataset-digest-mismatch": (
        'harnesses = ["nop"]\ndatasets = ["ds@000000"]\n',
        nothing,
        "run.toml: key 'datasets': 'ds@000000' is pinned to 000000 but "
        "its selected content has digest ",
    ),
    "task-missing-instruction": (GOOD, task(instruction=None), "hello/instruction.md: missing"),
    "task-missing-verifier": (GOOD, task(test=None), "hello/tests/test.sh: missing"),
    "task-bad-toml-type": (
        GOOD,
        task(task_toml='[agent]\ntimeout_sec = "long"\n'),
        "hello/task.toml: key 'agent.timeout_sec': input should be a valid number",
    ),
    "task-without-solution-for-oracle": (
        GOOD,
        task(solve=None),
        "hello: harness 'oracle' needs solution/solve.sh",
    ),
    "task-pattern-traversal": (
        GOOD + 'tasks = ["../x"]\n',
        nothing,
        "run.toml: key 'tasks': expected task name patterns",
    ),
    "task-pattern-matches-nothing": (
        GOOD + 'tasks = ["nothing*"]\n',
        nothing,
        "run.toml: key 'tasks': pattern 'nothing*' matches no task",
    ),
    "require-unmet": (
        GOOD + 'require = ["gpu"]\n',
        nothing,
        "run.toml: key 'require': sandbox 'docker' cannot provide 'gpu'",
    ),
    "sandbox-unknown": (
        GOOD + '[sandbox]\nprovider = "k8s"\n',
        nothing,
        "run.toml: key 'sandbox.provider': no sandbox provider named 'k8s'",
    ),
    "verifier-env-unset": (
        GOOD + '[verifier]\nenv = ["HEMRA_TEST_UNSET_VARIABLE"]\n',
        nothing,
        "key 'verifier.env': environment variable HEMRA_TEST_UNSET_VARIABLE is not set",
    ),
    "pass-env-not-a-name": (
        GOOD + '[sandbox]\npass_env = ["MY-TOKEN"]\n',
        nothing,
        "run.toml: key 'sandbox.pass_env': expected environment variable names, got 'MY-TOKEN'",
    ),
    "pass-env-names-a-provider-key": (
        GOOD + '[sandbox]\npass_env = ["OPENAI_API_KEY"]\n',
        nothing,
        "run.toml: key 'sandbox.pass_env': OPENAI_API_KEY holds a model provider's key"
        " (the key_env of provider 'openai'), which never enters a sandbox",
    ),
    "verifier-network": (
        GOOD + '[verifier]\nnetwork = "host"\n',
        nothing,
        "key 'verifier.network': input should be 'none' or 'bridge'",
    ),
    "harness-unknown-provider": (
        'harnesses = ["mine"]\ndatasets = ["ds"]\n',
        harness('kind = "program"\ncommand = ["true"]\nprovider = "acme"\n'),
        "mine.toml: key 'provider': no provider named 'acme'",
    ),
    "harness-key-without-provider": (
        'harnesses = ["mine"]\ndatasets = ["ds"]\n',
        harness('kind = "program"\ncommand = ["true"]\nkey_env = "HOME"\n'),
        "mine.toml: key 'key_env' needs a 'provider'",
    ),
    "new-provider-without-url": (
        GOOD + '[providers.local]\nkey_env = "X"\n',
        nothing,
        "run.toml: key 'providers.local.base_url' is required",
    ),
    "provider-bad-url": (
        GOOD + '[providers.local]\nbase_url = "ftp://x"\n',
        nothing,
        "key 'providers.local.base_url': string should match pattern",
    ),
    "gateway-other-models": (
        GOOD + '[gateway]\nother_models = "ignore"\n',
        nothing,
        "key 'gateway.other_models': input should be 'flag' or 'refuse'",
    ),
    "negative-budget": (
        GOOD + "budget_usd = -1.0\n",
        nothing,
        "key 'budget_usd': input should be greater than 0",
    ),
    "judge-both-ways": (
        GOOD + '[[judge]]\nname = "style"\nmodel = "m"\ncommand = ["true"]\n',
        nothing,
        "run.toml: key 'judge[0]': give a judge 'model' or 'command', not both",
    ),
    "judge-no-rubric": (
        GOOD + '[[judge]]\nname = "style"\nmodel = "m"\n',
        nothing,
        "run.toml: key 'judge[0].rubric': no rubric 'style'",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_with_one_line_and_nothing_recorded(
    case: str,
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    content, setup, expected = CASES[case]
    setup(tmp_path, make_task, write_harness)
    (tmp_path / "datasets" / "ds" / "bad name").mkdir()  # not a task: holds no task.toml
    run_file = tmp_path / "run.toml"
    run_file.write_text(content)

    result = pytester.runpytest("--hemra-run", str(run_file))

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.errlines
    assert expected in errors[0]
    assert not (pytester.path / ".hemra").exists()


def test_invalid_task_folder_name_is_refused(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("bad name")
    run_file = tmp_path / "run.toml"
    run_file.write_text(GOOD)
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *bad name: 'bad name' is not a valid task name"])
    assert not (pytester.path / ".hemra").exists()


def test_defaults_are_those_documented(tmp_path: Path) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["a", "b"]\ndatasets = ["d"]\n')
    spec = load_run_spec(run_file, Overrides())
    assert (spec.name, spec.baseline_harness, spec.attempts, spec.concurrency) == ("run", "a", 1, 1)
    assert (spec.model, spec.timeout_secs, spec.max_infra_retries) == (None, None, 0)
    assert (spec.tasks, spec.exclude, spec.require, spec.judge) == ([], [], [], [])
    assert spec.sandbox.provider == "docker" and spec.sandbox.image == "debian:bookworm-slim"
    assert spec.verifier.network == "none" and spec.verifier.env == []
    assert spec.sandbox.pass_env == []


def test_flags_replace_some_keys_and_add_to_others(tmp_path: Path) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        textwrap.dedent("""\
        harnesses = ["a", "b"]
        datasets = ["d1"]
        attempts = 2
        tasks = ["t1"]
        require = ["network_block"]
        [verifier]
        env = ["ONE"]
        [sandbox]
        image = "img"
        pass_env = ["P1"]
    """)
    )
    spec = load_run_spec(
        run_file,
        Overrides(
            harnesses=["c"],
            datasets=["d2"],
            attempts=3,
            tasks=["t2"],
            exclude=["t3"],
            baseline="c",
            concurrency=4,
            sandbox="other",
            require=["cpu_limit"],
            verifier_env=["TWO"],
            pass_env=["P2"],
            judges=["style"],
        ),
    )
    assert spec.harnesses == ["c"] and spec.datasets == ["d2"] and spec.attempts == 3
    assert spec.tasks == ["t2"] and spec.exclude == ["t3"] and spec.baseline == "c"
    assert spec.concurrency == 4
    assert spec.sandbox.provider == "other" and spec.sandbox.image == "img"
    assert spec.require == ["network_block", "cpu_limit"]
    assert spec.verifier.env == ["ONE", "TWO"]
    assert spec.sandbox.pass_env == ["P1", "P2"]
    assert [j.name for j in spec.judge] == ["style"]


def test_flags_alone_make_a_run_spec() -> None:
    spec = load_run_spec(None, Overrides(harnesses=["oracle"], datasets=["hemra-offline"]))
    assert isinstance(spec, RunSpec) and spec.harnesses == ["oracle"]


def test_the_documented_run_file_is_a_valid_run_file() -> None:
    text = (REPO / "docs" / "run-files.md").read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    spec = RunSpec.model_validate(tomllib.loads(example))
    assert spec.budget_usd == 20.0 and spec.gateway.other_models == "flag"
    assert spec.providers["anthropic"].base_url == "https://my-proxy.example/anthropic"
