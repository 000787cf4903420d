"""The SWE track: hidden tests applied after the agent, partial credit, and an error class.

After the agent, the task's hidden test patch is applied in /app (with `patch`, as the user
that owns /app: the sandbox's root holds no capabilities) on top of whatever the agent left:
uncommitted, committed or new files alike, since /app is read as files. The task's test
command runs; its pytest or unittest summary gives passed / total, the reward. No tests found
is a `crash`, never a pass, so a command like `true` scores nothing. Each trial gets one class:
success, partial, overfit, timeout, refusal, wrong_approach, crash, no_change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.execute.sandbox import Sandbox, output_of, run_as_owner

HIDDEN_PATCH = "/hemra/hidden-tests.patch"
CLASSES = (
    "success", "partial", "overfit", "timeout", "refusal", "wrong_approach", "crash", "no_change",
)  # fmt: skip
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|errors?|xfailed|xpassed|skipped)")
PYTEST_SUMMARY = re.compile(r"^=*\s*((\d+ [a-z]+(, )?)+|no tests ran) in [\d.]+s\b.*$")
UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in ", re.MULTILINE)
UNITTEST_FAILED = re.compile(r"^FAILED \(([^)]*)\)", re.MULTILINE)
REFUSAL_TEXT = re.compile(
    r"\b(I can(?:no|')t help|I (?:won't|will not|am unable to|cannot) (?:do|complete|help))",
    re.IGNORECASE,
)
OVERFIT_MAX_LINES = 6  # an agent diff this short that hard-codes the tests' values: overfit
LITERAL = re.compile(r"""(?<![\w.])(-?\d+(?:\.\d+)?|"[^"\n]{1,80}"|'[^'\n]{1,80}')""")


@dataclass(frozen=True)
class Tally:
    passed: int
    failed: int

    @property
    def total(self) -> int:
        return self.passed + self.failed


@dataclass(frozen=True)
class SweScore:
    reward: float
    error_class: str
    counts: Tally | None
    detail: str


def parse_test_output(text: str) -> Tally | None:
    """passed and failed (errors count as failed) from pytest's summary line, else unittest's
    `Ran N tests` and `FAILED (failures=.., errors=..)`; None when neither is there."""
    for line in reversed(text.splitlines()):
        if PYTEST_SUMMARY.match(line.strip()):
            counts = {kind: int(n) for n, kind in PYTEST_COUNTS.findall(line)}
            passed = counts.get("passed", 0) + counts.get("xpassed", 0)
            failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
            return Tally(passed, failed)
    ran = UNITTEST_RAN.findall(text)
    if ran:
        total = int(ran[-1])
        failed = 0
        verdicts = UNITTEST_FAILED.findall(text)
        if verdicts:
            failed = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", verdicts[-1]))
        return Tally(total - failed, failed)
    return None


def score(
    sandbox: Sandbox,
    task_path: Path,
    test_patch: str,
    test_command: list[str],
    timeout: float,
    agent_diff: str,
    agent_output: str,
    agent_timed_out: bool,
    logs: Path,
) -> SweScore:
    """Apply the hidden tests, run them, and classify the trial."""
    patch_text = (task_path / test_patch).read_bytes()
    sandbox.put_file(patch_text, HIDDEN_PATCH)
    folders = _new_folders(patch_text.decode(errors="replace"))
    if folders:  # patch makes new files, but not the folders they go in
        run_as_owner(sandbox, ["mkdir", "-p", "--", *folders], timeout=30, logs=logs, name="patch")
    patch_argv = ["patch", "-p1", "--forward", "--batch", "-i", HIDDEN_PATCH]
    applied = run_as_owner(sandbox, patch_argv, timeout=60, logs=logs, name="patch")
    if applied.exit_code != 0:
        said = output_of(logs, "patch").strip()
        last = said.splitlines()[-1] if said else f"exit {applied.exit_code}"
        return SweScore(0.0, "crash", None, f"the hidden test patch did not apply: {last}")
    ran = run_as_owner(sandbox, test_command, timeout=timeout, logs=logs)
    output = output_of(logs)
    counts = parse_test_output(output)
    hidden = patch_text.decode(errors="replace")
    error_class = classify(
        counts, ran.timed_out or agent_timed_out, agent_diff, agent_output, hidden
    )
    reward = counts.passed / counts.total if counts and counts.total else 0.0
    detail = (
        "the test command timed out" if ran.timed_out
        else "no tests ran (collected none, or the command is not a test runner)"
        if counts is None or counts.total == 0
        else f"{counts.passed}/{counts.total} tests passed"
    )  # fmt: skip
    return SweScore(reward if error_class != "crash" else 0.0, error_class, counts, detail)


def _new_folders(patch: str) -> list[str]:
    """Parent folders of the files a -p1 patch names, relative to /app."""
    folders = set()
    for line in patch.splitlines():
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            path = line[4:].split("\t")[0].strip()
            parts = path.split("/")[1:]  # -p1
            if len(parts) > 1 and ".." not in parts:
                folders.add("/".join(parts[:-1]))
    return sorted(folders)


def classify(
    counts: Tally | None,
    timed_out: bool,
    agent_diff: str,
    agent_output: str,
    hidden_tests: str,
) -> str:
    added = _added_lines(agent_diff)
    if counts is not None and counts.total and counts.passed == counts.total:
        return "success"
    if any("raise NotImplementedError" in line for line in added) or REFUSAL_TEXT.search(
        agent_output
    ):
        return "refusal"
    if not agent_diff.strip():
        return "no_change"
    if timed_out:
        return "timeout"
    if counts is None or counts.total == 0:
        return "crash"
    if _hard_codes(added, hidden_tests):
        return "overfit"
    return "partial" if counts.passed else "wrong_approach"


def _added_lines(diff: str) -> list[str]:
    return [
        line[1:]
        for line in diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]


def _hard_codes(added: list[str], hidden_tests: str) -> bool:
    """A short change whose added code returns or compares literals the hidden tests expect."""
    code = [line for line in added if line.strip() and not line.strip().startswith("#")]
    if not code or len(code) > OVERFIT_MAX_LINES:
        return False
    expected = set(LITERAL.findall("\n".join(_added_lines(hidden_tests))))
    literals = {lit for line in code for lit in LITERAL.findall(line)} - {"0", "1", "-1"}
    return bool(literals & expected)
