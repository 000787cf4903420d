"""Multi-step tasks (Harbor's [[steps]]) for real: each step's instruction and agent turn in one
sandbox, its own verifier, one stored row per step, the reward rolled up."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import bundled_dir, load_task
from pytest_hemra.store import Store

MULTI = bundled_dir("datasets") / "multi-step"
# writes greet.py as the first step wants it, whatever the step; and says whether the sandbox
# reached the gateway (an HTTP answer of any status) in this step
FIRST_STEP_ONLY = """kind = "program"
command = ["bash", "-c", '''
printf 'def greet(name):\\n    return "Hello, " + name\\n' > /app/greet.py
python3 - <<'PY' >> /app/net.log
import os, urllib.error, urllib.request
try:
    urllib.request.urlopen(os.environ["HEMRA_BASE_URL"] + "/v1/models", timeout=5)
    print("reached")
except urllib.error.HTTPError:
    print("reached")
except Exception as error:
    print("unreachable", type(error).__name__)
PY
''']
"""


@pytest.mark.usefixtures("docker_test")
@pytest.mark.parametrize("strategy", ["mean", "final"])
def test_each_step_is_run_verified_and_stored_and_the_reward_rolls_up(
    pytester: pytest.Pytester,
    tmp_path: Path,
    write_harness: Callable[[str, str], Path],
    strategy: str,
) -> None:
    task = tmp_path / "datasets" / "steps" / "greet-review-revise"
    shutil.copytree(MULTI / "greet-review-revise", task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('"mean"', f'"{strategy}"'))
    write_harness("first-only", FIRST_STEP_ONLY)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle", "first-only"]\ndatasets = ["steps"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    result.assert_outcomes(passed=1, failed=1)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    trials = {t.harness: t for t in store.trials(run.id)}
    oracle_steps = store.steps(trials["oracle"].id)
    assert [(s["seq"], s["name"], s["reward"]) for s in oracle_steps] == [
        (1, "implement", 1.0),
        (2, "review", 1.0),
        (3, "revise", 1.0),
    ]
    partial = trials["first-only"]
    assert [s["reward"] for s in store.steps(partial.id)] == [1.0, 0.0, 0.0]
    assert partial.reward == pytest.approx(1 / 3 if strategy == "mean" else 0.0)
    # the trial's rewards are Harbor's: each key rolled up (the steps' own are in `steps`)
    assert partial.rewards == {"reward": pytest.approx(partial.reward)}
    folder = Path(partial.trial_dir or "")
    assert (folder / "steps" / "02-review" / "verifier" / "reward.txt").read_text().strip() == "0"
    # the verifier cut the network after each step; the next step had it back
    net_log = [
        line for line in (folder / "diff.patch").read_text().splitlines() if "reached" in line
    ]
    assert net_log == ["+reached"] * 3, net_log


def test_steps_need_their_instruction_and_a_verifier(tmp_path: Path) -> None:
    task = tmp_path / "t"
    shutil.copytree(MULTI / "greet-review-revise", task)
    (task / "steps" / "review" / "instruction.md").unlink()
    with pytest.raises(SpecError, match=r"steps/review/instruction.md: missing or empty"):
        load_task(task)
    shutil.copytree(MULTI / "greet-review-revise", task, dirs_exist_ok=True)
    shutil.rmtree(task / "steps" / "revise" / "tests")
    with pytest.raises(SpecError, match=r"revise/tests/test.sh: missing, and the task has no"):
        load_task(task)
    loaded = load_task(MULTI / "greet-review-revise")
    assert [s.name for s in loaded.config.steps] == ["implement", "review", "revise"]
    assert loaded.config.steps[2].agent.timeout_sec == 60 and loaded.has_solution
