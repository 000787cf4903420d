"""The SWE track: hidden tests applied after the agent, partial credit, and an error class.

After the agent (whose processes are gone by then), /app is copied into a fresh folder owned by
a user of HEMRA's own (`VERIFIER_USER`, neither the agent's nor root; mode 0700, so nothing else
in the sandbox can read or change it). There, the test infrastructure is put back as the task
shipped it (`guard`): `conftest.py` anywhere, pytest's configuration under every name it reads,
`sitecustomize`/`usercustomize`, `.pth` files, plugin entry points, the tests folders, modules at
the top of /app named like the test runner's or an installed distribution's, the task's original
test files and every file the hidden patch touches; the hidden patch is applied with `patch`; the
task's test command runs with HEMRA's configuration (`-c` the task's shipped file, `--rootdir`),
HEMRA's pytest plugin, and, for `python -m pytest`, HEMRA's launcher, which loads pytest and all
it imports before /app joins sys.path (for `python -m unittest`, HEMRA's runner). The plugin or
runner writes each test's outcome to a report whose path only HEMRA's copies of them hold.
Passed / total, the reward, is read from that file alone, checked against the runner's own
summary lines; tests in files the agent added do not count. No tests found is a `crash`, never a
pass, so a command like `true` scores nothing. An agent that changed the test infrastructure, or
a report the summary does not bear out, gets the class `tampered` (the trial's outcome tampered,
reward 0: verification.py). Each trial gets one class: tampered, success, partial, overfit,
timeout, refusal, wrong_approach, crash, no_change.
"""

from __future__ import annotations

import re
import secrets
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pytest_hemra.core.outcome import SweClass
from pytest_hemra.execute.sandbox import ROOT_USER, ExecResult, Sandbox, output_of
from pytest_hemra.score import swe_probes
from pytest_hemra.score.swe_guard import guard, shipped_config

VERIFIER_USER = "65533:65533"  # neither the agent's user nor root: HEMRA's, for the hidden run
# the top-level modules of the installed distributions ("module NAME" a line), as the test
# command's Python finds them with the working folder (and any path under /app) left out
INSTALLED_PROBE = """
import os, pkgutil, sys, sysconfig
app = os.path.realpath(sys.argv[1])
skip = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")}
paths = []
for entry in sys.path:
    real = os.path.realpath(entry or ".")
    if not entry or real == app or real.startswith(app + os.sep) or entry.endswith(".zip"):
        continue
    if any(real == root or real.startswith(root + os.sep) for root in skip):
        continue
    paths.append(entry)
print("".join(f"module {module.name}\\n" for module in pkgutil.iter_modules(paths)), end="")
"""
PYTHON = re.compile(r"^python[\d.]*$")
SUMMARY_LINE_BYTES = 1 << 16  # the runner's output is read a line at a time, cut at this
OUTCOMES = ("passed", "failed", "skipped")
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
    swe_class: SweClass
    counts: Tally | None
    detail: str
    evidence: tuple[str, ...] = ()  # "path: why" a line, for a tampered trial


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
    before: Mapping[str, bytes],
    after: Mapping[str, bytes],
) -> SweScore:
    """Apply the hidden tests to a copy of /app the agent cannot reach, run them, read their
    outcomes from HEMRA's report file, and classify the trial."""
    patch_text = (task_path / test_patch).read_bytes()
    hidden = patch_text.decode(errors="replace")
    checked = guard(before, after, hidden)  # and again once the installed modules are known
    token = secrets.token_hex(8)
    # /hemra is root's in every sandbox image: no folder above the room holds a file the agent
    # could have left (pytest looks for conftest.py and its settings in every parent folder)
    stage = f"/hemra/swe-{token}"
    scratch = f"{stage}/room"
    # the report: a name of its own in a folder nobody but root can list, written into HEMRA's
    # copies of its plugin and runner, never in the tests' environment
    report_path = f"/hemra/out-{secrets.token_hex(8)}/{secrets.token_hex(16)}.tsv"
    names = Stage(
        f"hemra_swe_{token}", f"hemra_unittest_{token}.py", f"hemra_pytest_{token}.py", report_path
    )
    with tempfile.TemporaryDirectory(prefix="hemra-swe-") as host:
        _write_stage(Path(host), patch_text, checked.originals, names)
        sandbox.put_dir(Path(host), stage)  # root's, read-only: HEMRA's plugin and originals
    sandbox.exec(
        # the verifier's user may make its room in the stage, and its report in the other
        ["/bin/sh", "-c", 'chmod 1733 "$1" && mkdir -m 1733 "$2"', "prepare", stage,
         str(PurePosixPath(report_path).parent)],
        user=ROOT_USER, env={}, timeout=30, workdir="/",
        stdout=logs / "prepare.stdout.txt", stderr=logs / "prepare.stderr.txt",
    )  # fmt: skip
    prepared = _as_verifier(
        sandbox,
        ["/bin/sh", "-c", PREPARE, "prepare", scratch, stage, _python(test_command),
         INSTALLED_PROBE, *checked.removed],
        workdir="/", timeout=120, logs=logs, name="prepare",
    )  # fmt: skip
    lines = _text(logs, "prepare.stdout").splitlines()
    links = [line[5:] for line in lines if line.startswith("link ")]
    installed = frozenset(line[7:] for line in lines if line.startswith("module "))
    app = f"{scratch}/app"
    # a module the agent added named like an installed one: tampering, and out of the copy
    full = guard(before, after, hidden, installed)
    shadows = sorted(set(full.removed) - set(checked.removed))
    checked = full
    if shadows and prepared.exit_code == 0:
        _as_verifier(sandbox, ["rm", "-rf", "--", *shadows], workdir=app, timeout=60, logs=logs,
                     name="prepare-shadows")  # fmt: skip
    tampered = [*checked.tampered, *(f"{path}: a link, where a file that steers the tests goes"
                                     for path in links)]  # fmt: skip
    if prepared.exit_code != 0:
        return SweScore(0.0, SweClass.CRASH, None, "the copy of /app for the hidden tests failed")
    folders = _new_folders(hidden)
    if folders:  # patch makes new files, but not the folders they go in
        _as_verifier(sandbox, ["mkdir", "-p", "--", *folders], workdir=app, timeout=30, logs=logs,
                     name="patch")  # fmt: skip
    patch_argv = ["patch", "-p1", "--forward", "--batch", "-i", f"{stage}/tests.patch"]
    applied = _as_verifier(sandbox, patch_argv, workdir=app, timeout=60, logs=logs, name="patch")
    if applied.exit_code != 0:
        said = output_of(logs, "patch").strip()
        last = said.splitlines()[-1] if said else f"exit {applied.exit_code}"
        return SweScore(0.0, SweClass.CRASH, None, f"the hidden test patch did not apply: {last}")
    argv, by_unittest = _with_runner(
        test_command, f"{stage}/lib/{names.runner}", f"{stage}/lib/{names.launcher}"
    )
    config = shipped_config(before) or ""
    ini = f"{app}/{config}" if config else f"{stage}/hemra.ini"
    env = {
        "HOME": f"{scratch}/home",
        "TMPDIR": f"{scratch}/tmp",
        "USER": "hemra-verifier",
        "LOGNAME": "hemra-verifier",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONPATH": f"{stage}/lib",
        # HEMRA's configuration: the task's as shipped (else an empty one of HEMRA's), whatever
        # files pytest would otherwise find; HEMRA's plugin; no cache written or read
        "PYTEST_ADDOPTS": (
            f"-p {names.plugin} -p no:cacheprovider --confcutdir={app} --rootdir={app} -c {ini}"
        ),
    }
    ran = _as_verifier(sandbox, argv, workdir=app, timeout=timeout, logs=logs, env=env)
    folder, _, file = report_path.rpartition("/")
    report = sandbox.read_tree(folder).get(file)
    counts = read_report(report, checked.uncounted) if report is not None else None
    if counts is not None and counts.passed:  # a second channel: the runner's own summary
        claimed = summary_passes(logs / ("stderr.txt" if by_unittest else "stdout.txt"))
        if claimed is None and not tampered:  # tampering, if any, is the trial's class
            why = "the test runner printed no summary of its own to check HEMRA's report against"
            return SweScore(0.0, SweClass.CRASH, counts, why)
        if claimed is not None and counts.passed > claimed:
            tampered.append(
                f"{report_path}: {counts.passed} tests passed, the test runner's own summary "
                f"says {claimed}: the report was rewritten"
            )
    swe_class = (
        SweClass.TAMPERED if tampered
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
        detail += "; the agent changed the test infrastructure: " + "; ".join(tampered)
    crashed = counts is None or counts.total == 0
    return SweScore(0.0 if crashed else reward, swe_class, counts, detail, tuple(tampered))


# run as VERIFIER_USER: its own folder, a copy of /app in it, what steers the tests removed
# (links to such files too: the runner reads only regular files), then the originals put back
PREPARE = r"""
set -u
scratch=$1; stage=$2; python=$3; probe=$4; shift 4
umask 077
mkdir "$scratch" || exit 3
mkdir "$scratch/app" "$scratch/home" "$scratch/tmp" || exit 3
cp -R /app/. "$scratch/app/" || echo "hemra: some of /app could not be read" >&2
cd "$scratch/app" || exit 3
NAMES='-name conftest.py -o -name pytest.ini -o -name .pytest.ini -o -name pytest.toml
  -o -name .pytest.toml -o -name sitecustomize.py -o -name usercustomize.py -o -name *.pth
  -o -name entry_points.txt'
set -f
find . -type l \( $NAMES -o -name pyproject.toml -o -name setup.cfg -o -name tox.ini \) \
  -exec sh -c 'for f; do echo "link ${f#./}"; done' sh {} + -exec rm -f {} +
find . \( $NAMES \) ! -type d -exec rm -f {} +
find . \( -name __pycache__ -o -name .pytest_cache \) -prune -exec rm -rf {} +
set +f
rm -rf pytest.py _pytest py py.py pluggy pluggy.py unittest unittest.py iniconfig iniconfig.py
for path in "$@"; do rm -rf "./$path"; done
if [ -d "$stage/originals" ]; then cp -R "$stage/originals/." . || exit 4; fi
"$python" -I -c "$probe" /app 2>/dev/null || echo "hemra: $python did not list its modules" >&2
exit 0
"""


def _write_stage(host: Path, patch: bytes, originals: Mapping[str, bytes], names: Stage) -> None:
    (host / "tests.patch").write_bytes(patch)
    (host / "hemra.ini").write_text("[pytest]\n")  # the configuration of a task that ships none
    lib = host / "lib"
    lib.mkdir()
    probes = Path(swe_probes.__file__).parent
    for probe, copy in (
        ("pytest_report.py", f"{names.plugin}.py"), ("unittest_report.py", names.runner),
        ("pytest_launcher.py", names.launcher),
    ):  # fmt: skip
        text = (probes / probe).read_text()
        named = text.replace('REPORT = ""', f"REPORT = {names.report!r}", 1)
        if probe != "pytest_launcher.py" and named == text:
            raise AssertionError(f"{probe} has no REPORT to name")
        (lib / copy).write_text(named)
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


def _with_runner(command: Sequence[str], runner: str, launcher: str) -> tuple[list[str], bool]:
    """`python -m unittest ARGS` becomes `python RUNNER ARGS` (True: HEMRA's unittest runner),
    `python -m pytest ARGS` `python LAUNCHER ARGS`; pytest finds HEMRA's plugin through
    PYTEST_ADDOPTS however it is started."""
    argv = list(command)
    for at in range(len(argv) - 1):
        if argv[at] == "-m" and argv[at + 1] == "unittest":
            return [*argv[:at], runner, *argv[at + 2 :]], True
        if argv[at] == "-m" and argv[at + 1] in ("pytest", "py.test"):
            return [*argv[:at], launcher, *argv[at + 2 :]], False
    return argv, False


@dataclass(frozen=True)
class Stage:
    """The names of HEMRA's files for one hidden run."""

    plugin: str  # HEMRA's pytest plugin, a module name
    runner: str  # its unittest runner, a file name
    launcher: str  # its start of `python -m pytest`, a file name
    report: str  # the report's path, written into the plugin's and the runner's copies


def _python(test_command: Sequence[str]) -> str:
    """The test command's Python: its first word when that is a Python, else python3."""
    first = PurePosixPath(test_command[0]).name if test_command else ""
    return test_command[0] if PYTHON.match(first) else "python3"


def summary_passes(output: Path) -> int | None:
    """The fewest passed tests any summary line of the runner's output claims (pytest's `N
    passed, M failed in Xs`, unittest's `Ran N tests` less its `FAILED (failures=.., errors=..)`),
    read a line at a time; None when there is none. Lines the tests print can lower it, never
    raise it."""
    found: list[int] = []
    ran: int | None = None
    if not output.is_file():
        return None
    with output.open("rb") as handle:
        while chunk := handle.readline(SUMMARY_LINE_BYTES):
            line = chunk.decode(errors="replace").strip()
            if PYTEST_SUMMARY.match(line):
                counts = {kind: int(n) for n, kind in PYTEST_COUNTS.findall(line)}
                found.append(counts.get("passed", 0) + counts.get("xpassed", 0))
            elif match := UNITTEST_RAN.match(line):
                ran = int(match.group(1))
                found.append(ran)
            elif ran is not None and (match := UNITTEST_FAILED.match(line)):
                failed = re.findall(r"(?:failures|errors)=(\d+)", match.group(1))
                found.append(ran - sum(int(n) for n in failed))
    return min(found) if found else None


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
) -> SweClass:
    added = _added_lines(agent_diff)
    if counts is not None and counts.total and counts.passed == counts.total:
        return SweClass.SUCCESS
    if any("raise NotImplementedError" in line for line in added) or REFUSAL_TEXT.search(
        agent_output
    ):
        return SweClass.REFUSAL
    if not agent_diff.strip():
        return SweClass.NO_CHANGE
    if timed_out:
        return SweClass.TIMEOUT
    if counts is None or counts.total == 0:
        return SweClass.CRASH
    if _hard_codes(added, hidden_tests):
        return SweClass.OVERFIT
    return SweClass.PARTIAL if counts.passed else SweClass.WRONG_APPROACH


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
