"""A dataset's health, read from a `hemra check` run: each task's verdicts from the trials of
the bundled `oracle` (the task's own solution) and `nop` (does nothing).

- `broken`: the oracle passed in none of its attempts (infra_error and verifier_error count as
  not passing); `unchecked`: the oracle has no result at all (cancelled, never run).
- `flaky`: the oracle passed some of its attempts, not all.
- `verifier_offline`: an oracle attempt short of a pass whose verifier ran with its network cut
  and printed a network error (`NETWORK_ERRORS`).
- `trivial`: nop passed in some attempt: the tests pass with nothing done.
- `slow_build`: a trial's `image` phase took longer than the threshold.
- `needs_processes`: broken as the run ran it, the clean room having killed the processes its
  oracle left listening, and it passes when they are kept for its verifier (`hemra check` runs
  its oracle again so): set `[hemra] keep_agent_processes = true` in its task.toml.
- `healthy`: none of the above.

`broken`, `needs_processes` and `unchecked` fail a check; the others are warnings (`strict`
fails on `flaky`, `trivial` and `verifier_offline` too). Reads the store, the trial folders'
verifier output and each task's task.toml (its own verifier network policy); never a sandbox.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from pytest_hemra.core.errors import StoreError
from pytest_hemra.core.lifecycle import TrialStatus
from pytest_hemra.core.network import NETWORK_FIX, OUTPUT_TAIL_BYTES, network_error
from pytest_hemra.core.outcome import KILLED_LISTENERS, Outcome
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.reward import shown_reward
from pytest_hemra.core.words import plural
from pytest_hemra.report import SLOW_BUILD_SECS
from pytest_hemra.store import Store

ORACLE, NOP = "oracle", "nop"


class Verdict(StrEnum):
    BROKEN = "broken"
    UNCHECKED = "unchecked"
    FLAKY = "flaky"
    VERIFIER_OFFLINE = "verifier_offline"
    TRIVIAL = "trivial"
    SLOW_BUILD = "slow_build"
    NEEDS_PROCESSES = "needs_processes"
    HEALTHY = "healthy"


FAILING = frozenset({Verdict.BROKEN, Verdict.UNCHECKED, Verdict.NEEDS_PROCESSES})
KEEP_FIX = "set [hemra] keep_agent_processes = true in its task.toml"
FAILING_STRICT = FAILING | {Verdict.FLAKY, Verdict.TRIVIAL, Verdict.VERIFIER_OFFLINE}


@dataclass(frozen=True)
class Attempts:
    """One harness's attempts on a task: `passes` of the `results` (attempts that ended in an
    outcome other than cancelled), and every outcome in attempt order."""

    passes: int
    results: int
    outcomes: tuple[str, ...]

    @classmethod
    def of(cls, trials: Sequence[TrialRecord]) -> Attempts:
        ended = [t for t in trials if _has_result(t)]
        return cls(
            passes=sum(1 for t in ended if t.outcome == Outcome.PASS),
            results=len(ended),
            outcomes=tuple(str(t.outcome or t.status) for t in trials),
        )

    def __str__(self) -> str:
        return f"{self.passes}/{self.results}"


@dataclass(frozen=True)
class TaskHealth:
    task: str
    verdicts: tuple[Verdict, ...]
    oracle: Attempts
    nop: Attempts
    build_secs: float | None  # the longest `image` phase of its trials
    notes: tuple[str, ...]  # what each verdict other than healthy found
    trial: str | None  # the trial to look at first (`hemra show`): the one a verdict is about


@dataclass(frozen=True)
class DatasetHealth:
    run_id: str
    store: str
    dataset: str
    digest: str
    attempts: int
    slow_build_secs: float
    tasks: tuple[TaskHealth, ...]

    def counts(self) -> dict[str, int]:
        """How many tasks carry each verdict, in `Verdict`'s order (a task may carry several)."""
        found = {str(v): sum(1 for t in self.tasks if v in t.verdicts) for v in Verdict}
        return {verdict: count for verdict, count in found.items() if count}

    def exit_status(self, strict: bool = False) -> int:
        """1 when a task is broken or unchecked (with `strict`, also flaky, trivial or its
        verifier offline); else 0. Slow builds never fail a check: they depend on the machine
        and on what the engine already held."""
        failing = FAILING_STRICT if strict else FAILING
        return int(any(failing.intersection(t.verdicts) for t in self.tasks))


@dataclass(frozen=True)
class Evidence:
    """What a verdict reads of one trial beyond its row: its image phase, and the end of its
    verifier's output (read only for oracle attempts short of a pass)."""

    trial: TrialRecord
    build_secs: float | None
    verifier_output: str = ""


def check_health(
    store: Store, run_id: str, dataset: str, slow_build_secs: float = SLOW_BUILD_SECS
) -> DatasetHealth:
    """The health of every task of `dataset` in a run of `oracle` and `nop`."""
    run = store.run(run_id)
    plan = run.plan
    entry = plan.datasets.get(dataset)
    missing = [h for h in (ORACLE, NOP) if h not in plan.harness_names]
    if entry is None or missing:
        raise StoreError(
            f"{store.name}: run {run_id} is not a check of {dataset!r}"
            f" (it ran {', '.join(plan.harness_names)} on {', '.join(plan.datasets)})"
        )
    trials = [
        t
        for t in store.trials(run_id)
        if t.dataset == dataset and t.status != TrialStatus.DESELECTED
    ]
    verifier = plan.settings.get("verifier")
    run_network = str(verifier.get("network", "none")) if isinstance(verifier, dict) else "none"
    tasks = []
    for task in dict.fromkeys(t.task for t in trials):
        mine = [t for t in trials if t.task == task]
        evidence = {
            harness: [_evidence(store, t) for t in mine if t.harness == harness]
            for harness in (ORACLE, NOP)
        }
        cut = is_verifier_cut(run_network, _task_toml(entry.path, task))
        health = task_health(task, evidence[ORACLE], evidence[NOP], slow_build_secs, cut)
        tasks.append(_with_build(health, entry.build_secs.get(task), slow_build_secs))
    return DatasetHealth(
        run_id=run_id,
        store=store.name,
        dataset=dataset,
        digest=entry.digest or "",
        attempts=max((t.attempt for t in trials), default=1),
        slow_build_secs=slow_build_secs,
        tasks=tuple(tasks),
    )


def task_health(
    task: str,
    oracle: Sequence[Evidence],
    nop: Sequence[Evidence],
    slow_build_secs: float,
    verifier_cut: bool,
) -> TaskHealth:
    """One task's verdicts from its oracle and nop attempts (see the module's table)."""
    oracle_attempts = Attempts.of([e.trial for e in oracle])
    nop_attempts = Attempts.of([e.trial for e in nop])
    short = [e for e in oracle if _has_result(e.trial) and e.trial.outcome != Outcome.PASS]
    verdicts: list[Verdict] = []
    notes: list[str] = []
    about: list[str] = []
    if oracle_attempts.results == 0:
        verdicts.append(Verdict.UNCHECKED)
        notes.append("the oracle has no result (its trials were cancelled or never ran)")
    elif oracle_attempts.passes == 0:
        verdicts.append(Verdict.BROKEN)
        notes.append(f"oracle {describe(short[0])}")
        about.append(short[0].trial.id)
    elif short:
        verdicts.append(Verdict.FLAKY)
        notes.append(
            f"oracle passed {oracle_attempts.passes} of"
            f" {plural(oracle_attempts.results, 'attempt')};"
            f" attempt {short[0].trial.attempt}: {describe(short[0])}"
        )
        about.append(short[0].trial.id)
    offline = [(e, found) for e in short if (found := network_error(e.verifier_output))]
    if verifier_cut and offline:
        evidence, found = offline[0]
        verdicts.append(Verdict.VERIFIER_OFFLINE)
        notes.append(
            f"its verifier ran with its network cut and says {found!r}"
            f" (attempt {evidence.trial.attempt}): {NETWORK_FIX}"
        )
        about.append(evidence.trial.id)
    passed = [e for e in nop if e.trial.outcome == Outcome.PASS]
    if passed:
        verdicts.append(Verdict.TRIVIAL)
        notes.append(
            f"nop passed {nop_attempts.passes} of {plural(nop_attempts.results, 'attempt')}:"
            " the tests pass with nothing done"
        )
        about.append(passed[0].trial.id)
    builds = [e for e in (*oracle, *nop) if e.build_secs is not None]
    slowest = max(builds, key=lambda e: e.build_secs or 0.0, default=None)
    build_secs = None if slowest is None else slowest.build_secs
    if slowest is not None and build_secs is not None and build_secs > slow_build_secs:
        verdicts.append(Verdict.SLOW_BUILD)
        notes.append(f"its image took {build_secs:.0f}s (over {slow_build_secs:g}s)")
        about.append(slowest.trial.id)
    return TaskHealth(
        task=task,
        verdicts=tuple(verdicts) or (Verdict.HEALTHY,),
        oracle=oracle_attempts,
        nop=nop_attempts,
        build_secs=build_secs,
        notes=tuple(notes),
        trial=about[0] if about else None,
    )


def left_listening(health: DatasetHealth) -> list[str]:
    """Broken tasks whose oracle failed after the clean room killed what it left listening:
    the ones to try again with their processes kept."""
    return [
        task.task
        for task in health.tasks
        if Verdict.BROKEN in task.verdicts and any(KILLED_LISTENERS in n for n in task.notes)
    ]


def with_processes_kept(health: DatasetHealth, passed: set[str]) -> DatasetHealth:
    """`health` with the tasks whose oracle passed once its processes were kept (`passed`)
    `needs_processes` rather than `broken`, their note saying which key to set."""
    tasks = []
    for task in health.tasks:
        if task.task in passed and Verdict.BROKEN in task.verdicts:
            verdicts = tuple(
                Verdict.NEEDS_PROCESSES if v == Verdict.BROKEN else v for v in task.verdicts
            )
            note = (
                "its oracle passes only when the processes it leaves running outlive its turn"
                f" (run again with them kept): {KEEP_FIX}"
            )
            task = replace(task, verdicts=verdicts, notes=(note, *task.notes[1:]))
        tasks.append(task)
    return replace(health, tasks=tuple(tasks))


def describe(evidence: Evidence) -> str:
    """A trial short of a pass in one line: its outcome, reward, exit code and error, or the
    last line its verifier printed."""
    trial = evidence.trial
    reward = shown_reward(trial.outcome, trial.reward)
    exit_code = "" if trial.exit_code in (0, None) else f", exit code {trial.exit_code}"
    lines = [line.strip() for line in evidence.verifier_output.splitlines() if line.strip()]
    error = trial.error or (lines[-1] if lines else "")
    return f"{trial.outcome} ({reward}{exit_code})" + (f": {error}" if error else "")


def is_verifier_cut(run_network: str, task_toml: Mapping[str, Any]) -> bool:
    """Whether a verifier of the task (its own, or a step's) ran without a network, as
    `score.room` decides: its `[verifier] network_mode` when it sets one (an allowlist
    reaches its hosts), else the run's `[verifier] network`."""
    steps = task_toml.get("steps")
    tables = [task_toml, *(steps if isinstance(steps, list) else [])]
    for table in tables:
        found = table.get("verifier") if isinstance(table, dict) else None
        verifier = found if isinstance(found, dict) else {}
        mode = verifier.get("network_mode") or (
            "allowlist" if verifier.get("allowed_hosts") else None
        )
        if mode == "no-network" or (mode is None and run_network == "none"):
            return True
    return False


def _with_build(health: TaskHealth, built: float | None, slow_build_secs: float) -> TaskHealth:
    """The task's health with its image's build at resolve (before any trial) counted: a run
    builds its images then, so its trials' `image` phases only find them."""
    if built is None or (health.build_secs or 0.0) >= built:
        return health
    verdicts: list[Verdict] = [
        v for v in health.verdicts if v not in (Verdict.HEALTHY, Verdict.SLOW_BUILD)
    ]
    notes = [n for n in health.notes if not n.startswith("its image took")]
    if built > slow_build_secs:
        verdicts.append(Verdict.SLOW_BUILD)
        notes.append(f"its image took {built:.0f}s to build (over {slow_build_secs:g}s)")
    return replace(
        health,
        verdicts=tuple(verdicts) or (Verdict.HEALTHY,),
        build_secs=built,
        notes=tuple(notes),
    )


def _has_result(trial: TrialRecord) -> bool:
    """It ended in a result or an error (not cancelled, not still running)."""
    return trial.outcome is not None and trial.outcome != Outcome.CANCELLED


def _evidence(store: Store, trial: TrialRecord) -> Evidence:
    build = store.trial_detail(trial.id).phases.get("image")
    short = trial.harness == ORACLE and trial.outcome not in (None, Outcome.PASS)
    output = _verifier_output(trial.trial_dir) if short else ""
    return Evidence(trial, None if build is None else float(build), output)


def _verifier_output(trial_dir: str | None) -> str:
    """The end of each verifier's stdout and stderr (the task's, and each step's of a
    multi-step task), as the trial folder keeps them."""
    if not trial_dir:
        return ""
    parts = []
    folders = [Path(trial_dir) / "verifier", *sorted(Path(trial_dir).glob("steps/*/verifier"))]
    for path in (folder / name for folder in folders for name in ("stdout.txt", "stderr.txt")):
        try:
            with path.open("rb") as file:
                file.seek(max(path.stat().st_size - OUTPUT_TAIL_BYTES, 0))
                parts.append(file.read().decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(parts)


def _task_toml(dataset_path: str | None, task: str) -> dict[str, Any]:
    """The task's task.toml as recorded at its dataset's path ({} when it cannot be read)."""
    if dataset_path is None:
        return {}
    try:
        return tomllib.loads((Path(dataset_path) / task / "task.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def render_health(health: DatasetHealth, width: int | None = None) -> str:
    """The check as text: one row a task (fitting `width` columns; None: every column), each
    finding under the table, then the summary."""
    from pytest_hemra.core.terminal import fit_table, left_out_line, wrap_line

    rows = [
        [
            t.task,
            ", ".join(t.verdicts),
            str(t.oracle),
            str(t.nop),
            "-" if t.build_secs is None else f"{t.build_secs:.1f}s",
            t.trial or "",
        ]
        for t in health.tasks
    ]
    headers = ["task", "verdict", "oracle passes", "nop passes", "image", "trial"]
    if not any(t.trial for t in health.tasks):  # every task healthy: no trial to look at
        headers, rows = headers[:-1], [row[:-1] for row in rows]
    digest = health.digest[:12]
    fitted = fit_table(headers, rows, width)
    lines = [
        f"hemra check: {health.dataset}{'@' + digest if digest else ''},"
        f" {plural(len(health.tasks), 'task')}, oracle and nop x"
        f" {plural(health.attempts, 'attempt')}"
        f" (run {health.run_id})",
        "",
        fitted.text,
        *([left_out_line(fitted.dropped, width)] if fitted.dropped else []),
    ]
    findings = [wrap_line(f"{t.task}: {note}", width) for t in health.tasks for note in t.notes]
    if findings:
        lines += ["", *findings]
    counts = ", ".join(f"{count} {verdict}" for verdict, count in health.counts().items())
    lines += [
        "",
        f"{plural(len(health.tasks), 'task')}: {counts}",
        f"more: hemra report {health.run_id} --store {health.store};"
        f" hemra show TRIAL --store {health.store}",
    ]
    return "\n".join(lines)


def health_dict(health: DatasetHealth, strict: bool = False) -> dict[str, Any]:
    """The check as JSON-ready data (`hemra check --format json`)."""
    data = asdict(health)
    data["counts"] = health.counts()
    data["exit_status"] = health.exit_status(strict)
    return data
