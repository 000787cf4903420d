"""Red team: what a run takes in. Task folders whose links lead to host files, workers started
without the variables a harness needs, an upstream that refuses the runner's key, and the
harbor kind, which runs outside HEMRA's sandbox and so only when a run trusts it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, TaskMaker
from pytest_hemra.core.errors import SpecError
from pytest_hemra.core.records import UPSTREAM_REFUSED
from pytest_hemra.core.stored import StoredPlan
from pytest_hemra.report.fairness import dataset_flags
from pytest_hemra.resolve.datasets import bundled_dir, load_task, tree_digest
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.plan import resolve_plan
from pytest_hemra.store import Store
from tests.test_gateway_sandbox import PYTHON_IMAGE
from tests.upstream import REVOKED_KEY, running_upstream

SENTINEL = "host-secret-5c1e0a9d77"
VARIABLE = "HEMRA_REDTEAM_KEY"


def host_secret(tmp_path: Path) -> Path:
    """A host file outside every task folder, holding the sentinel."""
    secret = tmp_path / "host" / "secret.txt"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text(f"{SENTINEL}\n")
    return secret


def sentinel_files(root: Path, secret: Path) -> list[Path]:
    """Every file under `root` (links not followed) holding the sentinel, but the secret."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if path != secret and not path.is_symlink() and SENTINEL.encode() in path.read_bytes():
                found.append(path)
    return found


# ---- 7. links out of a task folder ----------------------------------------------------------


def test_a_task_whose_instruction_links_to_a_host_file_is_refused_and_nothing_recorded(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    secret = host_secret(tmp_path)
    task = make_task("leak", instruction=None)
    (task / "instruction.md").symlink_to(secret)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: {task / 'instruction.md'}: a link to {secret}, outside the task folder*"]
    )
    assert not (pytester.path / ".hemra").exists()
    assert sentinel_files(tmp_path, secret) == []


@pytest.mark.parametrize(
    "link",
    [
        "instruction.md",
        "task.toml",
        "solution/solve.sh",
        "tests/test.sh",
        "tests/data.txt",  # a file the verifier reads
        "environment/secret.txt",  # copied into the image build
        "tests/fixtures",  # a folder
        "solution/gone.sh",  # dangling: where it points still counts
    ],
)
def test_every_link_out_of_a_task_folder_is_refused_naming_it(
    tmp_path: Path, make_task: TaskMaker, link: str
) -> None:
    secret = host_secret(tmp_path)
    task = make_task("leak")
    target = {
        "tests/fixtures": secret.parent,
        "solution/gone.sh": secret.parent / "not-there.sh",
    }.get(link, secret)
    if link == "task.toml":  # a task.toml that is a link still parses, so let it read one
        target = secret.parent / "task.toml"
        shutil.copy(task / "task.toml", target)
    (task / link).unlink(missing_ok=True)
    (task / link).symlink_to(target)
    with pytest.raises(SpecError) as refused:
        load_task(task)
    assert str(refused.value) == (
        f"{task / link}: a link to {target}, outside the task folder {task}"
        " (a task's files must be inside its folder)"
    )


def test_a_step_instruction_linking_out_is_refused(tmp_path: Path) -> None:
    secret = host_secret(tmp_path)
    task = tmp_path / "greet-review-revise"
    shutil.copytree(bundled_dir("datasets") / "multi-step" / "greet-review-revise", task)
    instruction = task / "steps" / "review" / "instruction.md"
    instruction.unlink()
    instruction.symlink_to(secret)
    with pytest.raises(SpecError, match=r"steps/review/instruction.md: a link to .*secret.txt"):
        load_task(task)


def test_a_relative_link_climbing_out_is_refused_and_one_staying_inside_is_hashed_unfollowed(
    tmp_path: Path, make_task: TaskMaker
) -> None:
    host_secret(tmp_path)
    task = make_task("linked")
    (task / "tests" / "up").symlink_to("../../../../host")
    with pytest.raises(SpecError, match=r"tests/up: a link to .*/host, outside the task folder"):
        load_task(task)
    (task / "tests" / "up").unlink()
    (task / "solution" / "again.sh").symlink_to("solve.sh")  # inside: fine
    (task / "notes").symlink_to("solution")
    assert load_task(task).name == "linked"
    before = tree_digest(task.parent, [task])
    (task / "solution" / "again.sh").unlink()
    (task / "solution" / "again.sh").symlink_to("./solve.sh")  # same content, another link
    assert tree_digest(task.parent, [task]) != before  # the link is hashed as the link it is


@pytest.mark.usefixtures("docker_test")
def test_a_link_out_added_after_the_run_was_recorded_ends_the_trial_unscored(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    secret = host_secret(tmp_path)
    task = make_task("late")
    store = str(tmp_path / "s.db")
    queued = pytester.run(
        "hemra", "run", "-H", "oracle", "-d", str(tmp_path / "datasets" / "ds"),
        "--store", store, "--detach",
    )  # fmt: skip
    run_id = queued.outlines[0].strip()
    (task / "tests" / "answers.txt").symlink_to(secret)  # after resolve, before the trial
    resumed = pytester.run("hemra", "run", "--resume", run_id, "--store", store)
    assert resumed.ret == 1
    resumed.stdout.fnmatch_lines(["*infra_error*tests/answers.txt: a link to*outside the task*"])
    (trial,) = Store(Path(store)).trials(run_id)
    assert trial.outcome == "infra_error" and "answers.txt: a link to" in (trial.error or "")
    assert sentinel_files(tmp_path, secret) == []


@pytest.mark.usefixtures("docker_test")
def test_links_that_stay_inside_the_task_folder_run(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    task = make_task("inside", solve=None)
    (task / "solution").mkdir()
    (task / "solution" / "real.sh").write_text("echo hi > /app/out.txt\n")
    (task / "solution" / "solve.sh").symlink_to("real.sh")
    (task / "brief.md").write_text("Write hi to /app/out.txt.")
    (task / "instruction.md").unlink()
    (task / "instruction.md").symlink_to("brief.md")
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=1)


# ---- 8. workers check the variables a harness needs ----------------------------------------

NEEDS_VARIABLE = f"""\
kind = "program"
env = ["{VARIABLE}"]
command = ["bash", "-c", 'test "${VARIABLE}" = {SENTINEL} && echo hi > /app/out.txt']
"""


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_serve_worker_without_a_harness_variable_leaves_its_trials_queued(
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_task("one")
    make_task("two")
    write_harness("keyed", NEEDS_VARIABLE)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["keyed"]\ndatasets = ["ds"]\n')
    store_path = tmp_path / "s.db"
    with_it = {**os.environ, VARIABLE: SENTINEL}
    without = {k: v for k, v in os.environ.items() if k != VARIABLE}
    monkeypatch.delenv(VARIABLE, raising=False)

    def hemra(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["hemra", argv[0], "--store", str(store_path), *argv[1:]],
            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
        )  # fmt: skip

    refused = hemra("run", str(run_file), "--detach", env=without)  # resolve checks it too
    assert refused.returncode == 4 and f"needs environment variable {VARIABLE}" in refused.stderr
    queued = hemra("run", str(run_file), "--detach", env=with_it)
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    store = Store(store_path)

    served = hemra("serve", "--once", "--no-viewer", env=without)
    assert served.returncode == 0, served.stdout + served.stderr
    assert f"harness 'keyed' needs environment variable {VARIABLE}" in served.stdout
    assert store.job_counts(run_id) == {"queued": 2}
    assert [t.outcome for t in store.trials(run_id)] == [None, None]

    resumed = hemra("run", "--resume", run_id, "--", "-rs", env=without)  # a resumed session
    assert f"left queued: harness 'keyed' needs environment variable {VARIABLE}" in (resumed.stdout)
    assert store.job_counts(run_id) == {"queued": 2}
    assert [t.outcome for t in store.trials(run_id)] == [None, None]

    served = hemra("serve", "--once", "--no-viewer", env=with_it)
    assert served.returncode == 0, served.stdout + served.stderr
    assert [t.outcome for t in store.trials(run_id)] == ["pass", "pass"]


def test_a_harness_calling_a_real_provider_needs_its_key_at_resolve(
    tmp_path: Path, make_task: TaskMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_task("one")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["claude-code"]\ndatasets = ["ds"]\nmodel = "claude-x"\n')
    with pytest.raises(SpecError, match="need environment variable ANTHROPIC_API_KEY"):
        resolve_plan(run_file, Overrides(), tmp_path)
    run_file.write_text(
        'harnesses = ["claude-code"]\ndatasets = ["ds"]\nmodel = "hemra/scripted"\n'
    )
    assert resolve_plan(run_file, Overrides(), tmp_path).harnesses[0].name == "claude-code"


@pytest.mark.usefixtures("docker_test")
def test_an_upstream_refusing_the_runners_key_is_flagged_never_silently_scored(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", REVOKED_KEY + "-0a1b")
    make_task("ask", dockerfile=PYTHON_IMAGE)
    (tmp_path / "harnesses").mkdir()
    shutil.copy(
        REPO / "examples" / "scripted-agent" / "harnesses" / "mini-agent.toml",
        tmp_path / "harnesses",
    )
    run_file = tmp_path / "run.toml"
    with running_upstream() as upstream:
        run_file.write_text(
            'harnesses = ["mini-agent"]\ndatasets = ["ds"]\nmodel = "claude-sonnet-4-5"\n'
            f'[providers.anthropic]\nbase_url = "{upstream.url}"\n'
        )
        result = pytester.runpytest("--hemra-run", str(run_file))
    result.assert_outcomes(failed=1)  # its score stands: a refusal is no way out of a fail
    result.stdout.fnmatch_lines(
        ["! mini-agent: 1 scored trial had model calls the upstream refused (401/403*"]
    )
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    (trial,) = store.trials(run.id)
    assert trial.outcome in ("fail", "harness_error")
    assert (trial.error or "").startswith(f"{UPSTREAM_REFUSED} (401) on 1 of 1 model calls")
    assert "check ANTHROPIC_API_KEY" in (trial.error or "")


# ---- 9. the harbor kind only where a run trusts it -------------------------------------------


def test_a_harbor_harness_is_refused_unless_the_run_trusts_it_by_name(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("one")
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle", "harbor-oracle"]\ndatasets = ["ds"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *harbor-oracle.toml: a harbor harness runs outside*"])
    assert 'the run file must trust it: trust_unisolated = ["harbor-oracle"]' in result.stderr.str()
    assert not (pytester.path / ".hemra").exists()
    run_file.write_text(
        'harnesses = ["oracle", "harbor-oracle"]\ndatasets = ["ds"]\n'
        'trust_unisolated = ["orcale"]\n'
    )
    with pytest.raises(SpecError, match="key 'trust_unisolated': 'orcale' is not one of"):
        resolve_plan(run_file, Overrides(), tmp_path)


def test_a_trusted_harbor_harness_is_recorded_and_reported_as_not_isolated(
    tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("one")
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle", "harbor-oracle"]\ndatasets = ["ds"]\n'
        'trust_unisolated = ["harbor-oracle"]\n'
    )
    record = resolve_plan(run_file, Overrides(), tmp_path).record()
    assert record["harnesses"]["oracle"]["isolated"] is True
    assert record["harnesses"]["harbor-oracle"]["isolated"] is False
    plan = StoredPlan.read(record)
    assert plan.unisolated == {"harbor-oracle"} and plan.unmetered == {"harbor-oracle"}
    del record["harnesses"]["harbor-oracle"]["isolated"]  # a plan recorded before the bit
    assert StoredPlan.read(record).unisolated == {"harbor-oracle"}
    flags = dataset_flags([], ["oracle", "harbor-oracle"], None, plan.unmetered, plan.unisolated)
    assert [(f.kind, f.harness) for f in flags] == [
        ("not_metered", "harbor-oracle"),
        ("not_isolated", "harbor-oracle"),
    ]
    assert "outside HEMRA's sandbox" in str(flags[1])
