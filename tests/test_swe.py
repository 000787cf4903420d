"""The SWE track for real: swe-mini's hidden tests applied after the agent in Docker, partial
credit, and the error class of each kind of attempt."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import bundled_dir, load_task
from pytest_hemra.score.swe import Tally, classify, parse_test_output
from pytest_hemra.store import Store

SWE_MINI = bundled_dir("datasets") / "swe-mini"


def program(write_harness: Callable[[str, str], Path], name: str, script: str) -> None:
    write_harness(name, f"kind = \"program\"\ncommand = [\"bash\", \"-c\", '''\n{script}\n''']\n")


@pytest.mark.usefixtures("docker_test")
def test_each_kind_of_attempt_gets_its_class(
    pytester: pytest.Pytester, tmp_path: Path, write_harness: Callable[[str, str], Path]
) -> None:
    # a plausible wrong fix: hours and minutes, but seconds forgotten
    program(
        write_harness,
        "wrong-fix",
        textwrap.dedent(
            """\
            cd /app && cat > duration.py <<'PY'
            import re


            def parse_duration(text):
                units = {"h": 3600, "m": 60}
                return sum(int(n) * units.get(u, 0) for n, u in re.findall(r"(\\d+)([hms])", text))
            PY"""
        ),
    )
    # a hack: the one value the instruction names, hard-coded
    program(
        write_harness,
        "hard-code",
        textwrap.dedent(
            """\
            cd /app && python3 - <<'PY'
            source = open("fizz.py").read()
            hack = '    if n == 15:\\n        return "FizzBuzz"\\n'
            first = "    if n % 3 == 0:"
            open("fizz.py", "w").write(source.replace(first, hack + first, 1))
            PY"""
        ),
    )
    # a refusal: says so, and leaves the function raising
    program(
        write_harness,
        "refuser",
        'echo "I can\'t help with that."\n'
        "printf '    raise NotImplementedError\\n' >> /app/duration.py",
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle", "nop", "wrong-fix", "hard-code", "refuser"]\n'
        'datasets = ["swe-mini"]\ntasks = ["fizzbuzz-fix", "parse-duration"]\n'
    )
    pytester.runpytest("--hemra-run", str(run_file))
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    found = {(t.harness, t.task): (t.swe_class, t.reward) for t in store.trials(run.id)}
    assert found["oracle", "fizzbuzz-fix"] == ("success", 1.0)
    assert found["oracle", "parse-duration"] == ("success", 1.0)
    assert found["nop", "parse-duration"][0] == "no_change"
    assert found["wrong-fix", "parse-duration"] == ("partial", 3 / 5)
    assert found["hard-code", "fizzbuzz-fix"] == ("overfit", 4 / 6)
    assert found["refuser", "parse-duration"][0] == "refusal"
    rows = {t.harness: t for t in store.trials(run.id) if t.task == "parse-duration"}
    assert rows["wrong-fix"].outcome == "fail"
    trial_dir = Path(rows["oracle"].trial_dir or "")
    assert (trial_dir / "verifier" / "swe.txt").read_text() == "success: 5/5 tests passed\n"
    assert not (trial_dir / "diff.patch").read_text().count("test_duration")  # hidden from agent


@pytest.mark.usefixtures("docker_test")
def test_a_test_command_that_runs_no_tests_is_a_crash_never_a_pass(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    task = tmp_path / "datasets" / "mine" / "fizz"
    shutil.copytree(SWE_MINI / "fizzbuzz-fix", task)
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace('test_command = ["python3"', 'test_command = ["true"]\n#')
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["mine"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    result.assert_outcomes(failed=1)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    ((trial),) = [t for run in store.runs() for t in store.trials(run.id)]
    assert (trial.swe_class, trial.reward) == ("crash", 0.0)


def test_swe_task_settings_are_checked(tmp_path: Path) -> None:
    task = tmp_path / "t"
    shutil.copytree(SWE_MINI / "slugify", task)
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace('test_patch = "hidden/tests.patch"', 'test_patch = "../x"')
    )
    with pytest.raises(SpecError, match=r"task.toml: key 'hemra.test_patch': no file '../x'"):
        load_task(task)
    toml.write_text(toml.read_text().replace("test_command", "# test_command"))
    with pytest.raises(SpecError, match=r"key 'hemra.test_command' is required"):
        load_task(task)
    toml.write_text(toml.read_text() + 'typo = "x"\n')
    with pytest.raises(SpecError, match=r"hemra\.typo"):
        load_task(task)


def test_test_output_is_read_from_pytest_or_unittest() -> None:
    assert parse_test_output("..F\n==== 1 failed, 2 passed in 0.1s ====") == Tally(2, 1)
    assert parse_test_output("1 passed, 1 error in 0.01s") == Tally(1, 1)
    assert parse_test_output("==== no tests ran in 0.01s ====") == Tally(0, 0)
    unittest_out = "Ran 5 tests in 0.002s\n\nFAILED (failures=1, errors=1)\n"
    assert parse_test_output(unittest_out) == Tally(3, 2)
    assert parse_test_output("Ran 2 tests in 0.001s\n\nOK\n") == Tally(2, 0)
    assert parse_test_output("hello") is None


def test_classes_follow_the_documented_order() -> None:
    diff = "--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-    x = 1\n+    x = compute()\n"
    hidden = "+++ b/t.py\n+    assert f(15) == 'FizzBuzz'\n"
    assert classify(Tally(3, 0), False, diff, "", hidden) == "success"
    assert classify(Tally(1, 2), False, "", "", hidden) == "no_change"
    assert classify(Tally(1, 2), False, "", "I cannot do that.", hidden) == "refusal"
    assert classify(None, True, diff, "", hidden) == "timeout"
    assert classify(None, False, diff, "", hidden) == "crash"
    assert classify(Tally(0, 3), False, diff, "", hidden) == "wrong_approach"
    assert classify(Tally(2, 1), False, diff, "", hidden) == "partial"
    hack = "+++ b/f.py\n+    if n == 15:\n+        return 'FizzBuzz'\n"
    assert classify(Tally(2, 1), False, hack, "", hidden) == "overfit"


def test_swe_mini_tasks_load(tmp_path: Path) -> None:
    tasks = sorted(p.parent.name for p in SWE_MINI.glob("*/task.toml"))
    assert len(tasks) >= 4
    for name in tasks:
        assert load_task(SWE_MINI / name).config.hemra.track == "swe"
    assert textwrap.dedent("") == ""
