"""What a task's env templates may read: the runner's variables a run passes by name, and no key.

`${VAR}` and `${VAR:-default}` in task.toml's env tables (`[environment] env`, `[solution] env`,
`[verifier] env`, each step's `[verifier] env`) and in a compose file's `environment` are filled
from the runner's variables the run file lists in `[sandbox] pass_env`, and from nothing else: a
template of a variable not listed is its default, and one without a default refuses the task at
resolve. Harbor fills them from the host's whole environment; here a task (a dataset someone else
wrote) cannot pull a runner variable into a sandbox the run did not hand over by name.

A model provider's key (any variable the gateway or a harness holds as one) never fills a
template, listed or not: every sandbox holds what the agent left, and the verifier runs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pytest_hemra.core.environment import snapshot
from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import Task
from pytest_hemra.resolve.env_templates import render_env, template_names
from pytest_hemra.resolve.harnesses import Harness
from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS, ModelApi

PASS_ENV_KEY = "[sandbox] pass_env"
NEVER_A_KEY = (
    "which never enters a sandbox, listed in [sandbox] pass_env or not (the verifier runs code"
    " the agent left; agents reach models through the gateway with a trial token)"
)


def provider_keys(
    harnesses: Iterable[Harness], upstreams: Mapping[str, ModelApi]
) -> dict[str, str]:
    """The runner variables holding a model provider's key, each with what holds it as one:
    every upstream's `key_env` (the built-in providers' names even where the run's `[providers]`
    renamed them) and every harness's `key_env`."""
    keys: dict[str, str] = {}
    for upstream in [*BUILTIN_UPSTREAMS.values(), *upstreams.values()]:
        if upstream.key_env:
            keys.setdefault(upstream.key_env, f"the key_env of provider {upstream.name!r}")
    for harness in harnesses:
        if harness.spec.key_env:
            keys.setdefault(harness.spec.key_env, f"the key_env of harness {harness.name!r}")
    return keys


def check_pass_env(
    pass_env: Iterable[str], keys: Mapping[str, str], source: str, key: str = "sandbox.pass_env"
) -> None:
    """`[sandbox] pass_env` (or the run's `[verifier] env`) names no provider's key."""
    for name in pass_env:
        if name in keys:
            raise SpecError(
                f"{source}: key '{key}': {name} holds a model provider's key"
                f" ({keys[name]}), {NEVER_A_KEY}"
                + (VERIFIER_MODEL if key == "verifier.env" else "")
            )


# what a verifier that calls a model gets instead of a key
VERIFIER_MODEL = (
    "; a verifier that calls a model gets what judges get instead: [verifier] model_access ="
    " true (HEMRA_BASE_URL and HEMRA_API_KEY, a gateway token of the trial's)"
)


def template_tables(task: Task) -> list[tuple[str, dict[str, str]]]:
    """Every env table of a task whose values are templates, each with where it is (the file
    and its key), in the order a task's author reads them."""
    config, toml = task.config, task.path / "task.toml"
    tables = [
        (f"{toml}: key 'environment.env'", config.environment.env),
        (f"{toml}: key 'solution.env'", config.solution.env),
        (f"{toml}: key 'verifier.env'", config.verifier.env),
        *(
            [(f"{toml}: key 'verifier.environment.env'", config.verifier.environment.env)]
            if config.verifier.environment is not None
            else []
        ),
        *(
            (f"{toml}: key 'steps[{i}].verifier.env'", step.verifier.env)
            for i, step in enumerate(config.steps)
        ),
    ]
    if task.compose is not None:
        tables += [
            (f"{task.compose.path}: service {name!r}: key 'environment'", env)
            for name, env in task.compose.variables().items()
        ]
    return tables


def check_task_templates(
    task: Task, pass_env: Iterable[str], keys: Mapping[str, str], source: str
) -> None:
    """Each template of a task reads a variable the run passes (and that is set, unless the
    template has a default), or has a default; none reads a provider's key."""
    passed, runner = set(pass_env), snapshot()
    for where, env in template_tables(task):
        for name, has_default in template_names(env).items():
            if name in keys:
                raise SpecError(
                    f"{where}: ${{{name}}} is a model provider's key ({keys[name]}), {NEVER_A_KEY}"
                )
            if name in passed:
                if not has_default and name not in runner:
                    raise SpecError(
                        f"{where}: environment variable {name} is not set (the run passes it:"
                        f" {PASS_ENV_KEY} in {source})"
                    )
            elif not has_default:
                add = (
                    f"add it to {PASS_ENV_KEY} in a run file or pass --pass-env {name}"
                    if source == "command line"
                    else f'add it to {PASS_ENV_KEY} in {source} (pass_env = ["{name}"])'
                )
                raise SpecError(
                    f"{where}: ${{{name}}} reads runner variable {name}, which the run does not"
                    f" pass to sandboxes: {add} or give the template a default (${{{name}:-...}})"
                )


def passed_variables(pass_env: Iterable[str]) -> dict[str, str]:
    """The runner's variables named in `pass_env` that are set: all a template may read."""
    runner = snapshot()
    return {name: runner[name] for name in pass_env if name in runner}


def render_sandbox_env(env: dict[str, str], pass_env: Iterable[str]) -> dict[str, str]:
    """`env` (a task's env table) with its templates filled from the variables the run passes
    and no others: a template of any other variable becomes its default, else ''."""
    return render_env(env, passed_variables(pass_env))
