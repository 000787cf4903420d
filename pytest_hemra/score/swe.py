"""The SWE track: hidden tests applied after the agent, partial credit, and an error class.

After the agent (whose processes are gone by then), /app is copied into a fresh folder owned by
a user of HEMRA's own (`VERIFIER_USER`, neither the agent's nor root; mode 0700, so nothing else
in the sandbox can read or change it). There, files that steer test collection or outcomes are
put back as the task shipped them (`conftest.py` anywhere, `pytest.ini`, the pytest sections of
`tox.ini`, `setup.cfg` and `pyproject.toml`, `sitecustomize`/`usercustomize`, `.pth` files,
plugin entry points, modules that stand in for the test runner, the task's original test files
and every file the hidden patch touches); the hidden patch is applied with `patch`; the task's
test command runs with HEMRA's pytest plugin (or, for `python -m unittest`, HEMRA's runner),
which writes each test's outcome to a file in that folder. Passed / total, the reward, is read
from that file alone, never from what the command prints; tests in files the agent added do not
count. No tests found is a `crash`, never a pass, so a command like `true` scores nothing. An
agent that changed any of those files gets the class `tampered` (its score is that of the files
as shipped). Each trial gets one class: tampered, success, partial, overfit, timeout, refusal,
wrong_approach, crash, no_change.
"""

from __future__ import annotations

import configparser
import re
import secrets
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pytest_hemra.execute.sandbox import ROOT_USER, ExecResult, Sandbox, output_of
from pytest_hemra.score import swe_probes

VERIFIER_USER = "65533:65533"  # neither the agent's user nor root: HEMRA's, for the hidden run
CLASSES = (
    "tampered", "success", "partial", "overfit", "timeout", "refusal", "wrong_approach", "crash",
    "no_change",
)  # fmt: skip
# files that steer test collection or outcomes, wherever they are: put back as shipped
STEERING_NAMES = frozenset({"conftest.py", "pytest.ini", "sitecustomize.py", "usercustomize.py"})
STEERING_SECTIONS = {  # config files whose pytest part alone steers the tests
    "pyproject.toml": ("tool", "pytest"),
    "setup.cfg": ("tool:pytest",),
    "tox.ini": ("pytest",),
}
# modules at the top of /app (first on sys.path) that would stand in for the test runner
RUNNER_MODULES = ("pytest", "_pytest", "py", "pluggy", "unittest", "iniconfig")
OUTCOMES = ("passed", "failed", "skipped")
TEST_FILE = re.compile(r"^(test.*|.*_test)\.py$")
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


@dataclass(frozen=True)
class Guard:
    """What the hidden run puts back as the task shipped it, and what the agent touched."""

    originals: dict[str, bytes]  # /app-relative path: content before the agent, restored
    removed: tuple[str, ...]  # paths removed before the originals go back (and test files the
    # agent added: not run, so nothing they do at import reaches the test run)
    tampered: tuple[str, ...]  # what the agent changed that steers the tests
    uncounted: frozenset[str]  # files the agent added: their tests do not count


def guard(before: Mapping[str, bytes], after: Mapping[str, bytes], hidden_patch: str) -> Guard:
    """Compare /app before and after the agent (regular files, as read by the runner)."""
    touched = set(_patched_files(hidden_patch))
    originals: dict[str, bytes] = {}
    removed: set[str] = set(touched)
    tampered: list[str] = []
    for path in sorted(set(before) | set(after)):
        if not _is_safe(path):
            continue
        name = PurePosixPath(path).name
        was, now = before.get(path), after.get(path)
        changed = was != now
        if _is_steering(path) or (name == "entry_points.txt" and b"pytest11" in (now or b"")):
            if changed:
                tampered.append(f"{_verb(was, now)} {path}")
                removed.add(path)
        elif name in STEERING_SECTIONS and _pytest_section(name, was) != _pytest_section(name, now):
            tampered.append(f"{_verb(was, now)} the pytest settings of {path}")
            removed.add(path)
        elif path in touched and was is not None and changed:
            tampered.append(f"{_verb(was, now)} {path}, which the hidden tests patch")
        keep = _is_steering(path) or name == "entry_points.txt" or TEST_FILE.match(name)
        if was is not None and (keep or path in removed) and (was or changed):
            originals[path] = was  # a file over the read cap reads as empty: left as it is
    uncounted = frozenset(p for p in after if p not in before and p not in touched)
    removed |= {p for p in uncounted if _is_safe(p) and TEST_FILE.match(PurePosixPath(p).name)}
    return Guard(originals, tuple(sorted(removed)), tuple(tampered), uncounted)


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
    before: Mapping[str, bytes],
    after: Mapping[str, bytes],
) -> SweScore:
    """Apply the hidden tests to a copy of /app the agent cannot reach, run them, read their
    outcomes from HEMRA's report file, and classify the trial."""
    patch_text = (task_path / test_patch).read_bytes()
    hidden = patch_text.decode(errors="replace")
    checked = guard(before, after, hidden)
    token = secrets.token_hex(8)
    # /hemra is root's in every sandbox image: no folder above the room holds a file the agent
    # could have left (pytest looks for conftest.py and its settings in every parent folder)
    stage = f"/hemra/swe-{token}"
    scratch = f"{stage}/room"
    plugin, runner = f"hemra_swe_{token}", f"hemra_unittest_{token}.py"
    with tempfile.TemporaryDirectory(prefix="hemra-swe-") as host:
        _write_stage(Path(host), patch_text, checked.originals, plugin, runner)
        sandbox.put_dir(Path(host), stage)  # root's, read-only: HEMRA's plugin and originals
    sandbox.exec(
        ["chmod", "1733", stage],  # the verifier's user may make its room in it
        user=ROOT_USER, env={}, timeout=30, workdir="/",
        stdout=logs / "prepare.stdout.txt", stderr=logs / "prepare.stderr.txt",
    )  # fmt: skip
    prepared = _as_verifier(
        sandbox, ["/bin/sh", "-c", PREPARE, "prepare", scratch, stage, *checked.removed],
        workdir="/", timeout=120, logs=logs, name="prepare",
    )  # fmt: skip
    links = [
        line[5:] for line in _text(logs, "prepare.stdout").splitlines() if line.startswith("link ")
    ]
    tampered = [*checked.tampered, *(f"linked {path}" for path in links)]
    if prepared.exit_code != 0:
        return SweScore(0.0, "crash", None, "the copy of /app for the hidden tests failed")
    app = f"{scratch}/app"
    folders = _new_folders(hidden)
    if folders:  # patch makes new files, but not the folders they go in
        _as_verifier(sandbox, ["mkdir", "-p", "--", *folders], workdir=app, timeout=30, logs=logs,
                     name="patch")  # fmt: skip
    patch_argv = ["patch", "-p1", "--forward", "--batch", "-i", f"{stage}/tests.patch"]
    applied = _as_verifier(sandbox, patch_argv, workdir=app, timeout=60, logs=logs, name="patch")
    if applied.exit_code != 0:
        said = output_of(logs, "patch").strip()
        last = said.splitlines()[-1] if said else f"exit {applied.exit_code}"
        return SweScore(0.0, "crash", None, f"the hidden test patch did not apply: {last}")
    argv = _with_runner(test_command, f"{stage}/lib/{runner}")
    env = {
        "HOME": f"{scratch}/home",
        "TMPDIR": f"{scratch}/tmp",
        "USER": "hemra-verifier",
        "LOGNAME": "hemra-verifier",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONPATH": f"{stage}/lib",
        "PYTEST_ADDOPTS": f"-p {plugin} -p no:cacheprovider --confcutdir={app}",
        "HEMRA_SWE_REPORT": f"{scratch}/out/report.tsv",
    }
    ran = _as_verifier(sandbox, argv, workdir=app, timeout=timeout, logs=logs, env=env)
    report = sandbox.read_tree(f"{scratch}/out").get("report.tsv")
    counts = read_report(report, checked.uncounted) if report is not None else None
    error_class = (
        "tampered" if tampered
        else classify(counts, ran.timed_out or agent_timed_out, agent_diff, agent_output, hidden)
    )  # fmt: skip
    reward = counts.passed / counts.total if counts and counts.total else 0.0
    detail = (
        "the test command timed out" if ran.timed_out
        else "no tests ran (collected none, or the command is not a test runner)"
        if counts is None or counts.total == 0
        else f"{counts.passed}/{counts.total} tests passed"
    )  # fmt: skip
    if tampered:
        detail += "; the agent changed what steers the tests (put back as shipped): " + "; ".join(
            tampered
        )
    crashed = counts is None or counts.total == 0
    return SweScore(0.0 if crashed else reward, error_class, counts, detail)


# run as VERIFIER_USER: its own folder, a copy of /app in it, what steers the tests removed
# (links to such files too: the runner reads only regular files), then the originals put back
PREPARE = r"""
set -u
scratch=$1; stage=$2; shift 2
umask 077
mkdir "$scratch" || exit 3
mkdir "$scratch/app" "$scratch/home" "$scratch/tmp" "$scratch/out" || exit 3
cp -R /app/. "$scratch/app/" || echo "hemra: some of /app could not be read" >&2
cd "$scratch/app" || exit 3
NAMES='-name conftest.py -o -name pytest.ini -o -name sitecustomize.py -o -name usercustomize.py
  -o -name *.pth -o -name entry_points.txt'
set -f
find . -type l \( $NAMES -o -name pyproject.toml -o -name setup.cfg -o -name tox.ini \) \
  -exec sh -c 'for f; do echo "link ${f#./}"; done' sh {} + -exec rm -f {} +
find . \( $NAMES \) ! -type d -exec rm -f {} +
set +f
rm -rf pytest.py _pytest py py.py pluggy pluggy.py unittest unittest.py iniconfig iniconfig.py
for path in "$@"; do rm -rf "./$path"; done
if [ -d "$stage/originals" ]; then cp -R "$stage/originals/." . || exit 4; fi
"""


def _write_stage(
    host: Path, patch: bytes, originals: Mapping[str, bytes], plugin: str, runner: str
) -> None:
    (host / "tests.patch").write_bytes(patch)
    lib = host / "lib"
    lib.mkdir()
    probes = Path(swe_probes.__file__).parent
    (lib / f"{plugin}.py").write_bytes((probes / "pytest_report.py").read_bytes())
    (lib / runner).write_bytes((probes / "unittest_report.py").read_bytes())
    for path, content in originals.items():
        target = host / "originals" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _as_verifier(
    sandbox: Sandbox,
    argv: Sequence[str],
    *,
    workdir: str,
    timeout: float,
    logs: Path,
    name: str = "",
    env: Mapping[str, str] | None = None,
) -> ExecResult:
    return sandbox.exec(
        argv,
        user=VERIFIER_USER,
        env=env or {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=timeout,
        stdout=logs / (f"{name}.stdout.txt" if name else "stdout.txt"),
        stderr=logs / (f"{name}.stderr.txt" if name else "stderr.txt"),
        workdir=workdir,
    )


def _text(logs: Path, name: str) -> str:
    path = logs / f"{name}.txt"
    return path.read_text(errors="replace") if path.is_file() else ""


def _with_runner(command: Sequence[str], runner: str) -> list[str]:
    """`python -m unittest ARGS` becomes `python RUNNER ARGS`; pytest finds HEMRA's plugin
    through PYTEST_ADDOPTS however it is started."""
    argv = list(command)
    for at in range(len(argv) - 1):
        if argv[at] == "-m" and argv[at + 1] == "unittest":
            return [*argv[:at], runner, *argv[at + 2 :]]
    return argv


def read_report(report: bytes, uncounted: frozenset[str] = frozenset()) -> Tally:
    """passed and failed from HEMRA's report (`outcome<TAB>file<TAB>test id` a line; a test
    reported twice failed if either says so); skipped tests and those in files the agent added
    do not count."""
    outcomes: dict[str, str] = {}
    for line in report.decode(errors="replace").splitlines():
        parts = line.split("\t", 2)
        if len(parts) != 3 or parts[1] in uncounted or parts[0] not in OUTCOMES:
            continue
        test = f"{parts[1]}\t{parts[2]}"
        if outcomes.get(test) != "failed":
            outcomes[test] = parts[0]
    values = list(outcomes.values())
    return Tally(values.count("passed"), values.count("failed"))


def _patched_files(patch: str) -> list[str]:
    """The /app-relative files a -p1 patch writes."""
    files = []
    for line in patch.splitlines():
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            parts = line[4:].split("\t")[0].strip().split("/")[1:]
            if parts and ".." not in parts:
                files.append("/".join(parts))
    return files


def _is_safe(path: str) -> bool:
    return bool(path) and not path.startswith("/") and ".." not in path.split("/")


def _is_steering(path: str) -> bool:
    parts = PurePosixPath(path).parts
    name = parts[-1]
    if name in STEERING_NAMES or name.endswith(".pth"):
        return True
    top = parts[0].removesuffix(".py")
    return top in RUNNER_MODULES and (len(parts) > 1 or name.endswith(".py"))


def _pytest_section(name: str, content: bytes | None) -> object:
    """The part of a config file pytest reads (its text when it does not parse)."""
    if content is None:
        return None
    text = content.decode(errors="replace")
    if name == "pyproject.toml":
        try:
            return tomllib.loads(text).get("tool", {}).get("pytest")
        except tomllib.TOMLDecodeError:
            return text
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return text
    return {
        section: dict(parser.items(section))
        for section in STEERING_SECTIONS[name]
        if parser.has_section(section)
    }


def _verb(was: bytes | None, now: bytes | None) -> str:
    return "added" if was is None else "removed" if now is None else "changed"


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
