"""One trial, start to result: sandbox, harness, diff, verifier, reward, outcome, trial folder.

An outcome is a value: a harness that fails, crashes or times out is a result (and still
verified). Exceptions are for infrastructure, and `errors.outcome_of` maps them to outcomes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import asdict, replace
from pathlib import Path

from pytest_hemra.core.backoff import engine_settle_secs
from pytest_hemra.core.errors import (
    HemraError,
    InfraError,
    Tampered,
    VerifierError,
    outcome_of,
)
from pytest_hemra.core.network import OUTPUT_TAIL_BYTES, network_error
from pytest_hemra.core.outcome import KILLED_LISTENERS, Cause, Outcome, SweClass
from pytest_hemra.core.reward import is_pass
from pytest_hemra.core.trial import Judgment, TrialResult
from pytest_hemra.execute.artifacts import collect as collect_artifacts
from pytest_hemra.execute.context import Progress, TrialContext
from pytest_hemra.execute.diff import write_diff
from pytest_hemra.execute.installs import ensure_installed
from pytest_hemra.execute.output import FolderBudget
from pytest_hemra.execute.sandbox import (
    Limits,
    Sandbox,
    SandboxRequest,
)
from pytest_hemra.execute.sandbox.client import LOCAL_ENGINE
from pytest_hemra.execute.sandbox.health import (
    is_engine_answer,
    is_engine_fault,
    is_slow_answer,
)
from pytest_hemra.resolve.limits import task_limits, with_run_defaults
from pytest_hemra.run.admission import admission
from pytest_hemra.run.outage import is_runner_disk_full, settled, write_durably
from pytest_hemra.run.steps import run_steps
from pytest_hemra.run.turn import (
    AGENT_LOGS,
    gateway_port,
    healthy,
    instruction_files,
    keep_tree_notes,
    model_access,
    proxy_port,
    run_agent,
)
from pytest_hemra.score.judges import material, run_judge
from pytest_hemra.score.room import verifier_network, verifier_room
from pytest_hemra.score.tamper import raise_tampered, tampering
from pytest_hemra.score.verification import (
    provider_keys,
    verify_open,
    verify_reward,
    verify_swe,
)

# the phases of a trial before its agent runs (each recorded as it ends)
BEFORE_AGENT = frozenset({"place", "image", "start"})
TAMPER_WAIT_SECS = 600.0  # the engine's diff of a sandbox (each request has its own timeout)


def run_trial(context: TrialContext) -> TrialResult:
    """Run one trial to a result; never raises for anything a trial can end in."""
    context = replace(context, task=with_run_defaults(context.spec.sandbox, context.task))
    started_at = time.time()
    clock = time.monotonic()
    progress = Progress()
    reward: float | None = None
    rewards: dict[str, float] = {}
    error: str | None = None
    retried = False
    try:
        context.trial_dir.mkdir(parents=True, exist_ok=True)
        with _placed(context, progress) as placed:
            reward, rewards = _run_in_sandbox(placed, progress)
        outcome = _classify(reward, progress)
    except Tampered as failure:  # a result: the agent's, scored 0
        outcome, retried = outcome_of(failure)
        reward, rewards, error = 0.0, {"reward": 0.0}, str(failure)
        progress.cause = Cause.TAMPERED
        if context.task.config.hemra.track == "swe":  # its class too, whichever check caught it
            progress.swe_class = SweClass.TAMPERED
        _keep_evidence(context.trial_dir, failure)
    except HemraError as failure:
        outcome, retried = outcome_of(failure)
        error = str(failure)
        outage = _outage_cause(failure, context, progress)
        if outage in Cause.WAITED_OUT and outcome == Outcome.VERIFIER_ERROR:
            outcome, retried = Outcome.INFRA_ERROR, True  # the engine went away under it
        elif outcome == Outcome.VERIFIER_ERROR:  # the sandbox the agent left gave no reward
            reward, rewards = 0.0, {"reward": 0.0}
        progress.cause = outage or progress.cause
    except Exception as failure:  # anything unexpected under a trial is infrastructure
        outcome, retried = outcome_of(failure)
        error = f"{type(failure).__name__}: {failure}"
        progress.cause = _outage_cause(failure, context, progress) or progress.cause
    result = TrialResult(
        outcome=outcome,
        reward=reward,
        rewards=rewards,
        exit_code=progress.exit_code,
        error=error,
        started_at=started_at,
        finished_at=time.time(),
        duration=round(time.monotonic() - clock, 4),
        phases=progress.phases,
        trial_dir=str(context.trial_dir),
        usage=progress.usage,
        own_report=progress.own_report,
        retried=retried,
        swe_class=progress.swe_class,
        cause=progress.cause,
        steps=progress.steps,
        engine=progress.engine,
        agent_user=progress.agent_user,
        kept_processes=context.keeps_processes,
    )
    if progress.killed_listeners and outcome in (Outcome.FAIL, Outcome.VERIFIER_ERROR):
        result.error = killed_listeners_note(progress.killed_listeners, error)
    result.judgments = list(progress.judgments)
    if context.judges and result.is_scored:
        with progress.phase("judges"):
            result.judgments += _judge(context, reward)
        result.finished_at = time.time()
        result.duration = round(time.monotonic() - clock, 4)
    write_durably(context.trial_dir / "result.json", json.dumps(asdict(result), indent=2) + "\n")
    return result


def killed_listeners_note(ports: tuple[int, ...], error: str | None) -> str:
    """A failed trial's reason when the clean room killed the agent's listening processes."""
    listed = ", ".join(str(port) for port in ports)
    note = (
        f"{KILLED_LISTENERS} {listed} before the verifier ran; if the task's tests need them"
        " running, set [hemra] keep_agent_processes = true in its task.toml (or [verifier]"
        " keep_agent_processes in the run file)"
    )
    return f"{error}; {note}" if error else note


@contextmanager
def _unwaited(executor: ThreadPoolExecutor) -> Iterator[ThreadPoolExecutor]:
    """An executor whose leaving never waits for its work: a wait past its deadline is over."""
    try:
        yield executor
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def _tamper_evidence(found: Future[list[str]]) -> list[str]:
    """The engine's tamper evidence, waited for up to TAMPER_WAIT_SECS."""
    try:
        return found.result(timeout=TAMPER_WAIT_SECS)
    except TimeoutError:
        raise InfraError(
            f"the engine's diff of the sandbox did not come within {TAMPER_WAIT_SECS:g}s"
        ) from None


def _keep_evidence(folder: Path, failure: Tampered) -> None:
    """What made the trial `tampered`, for `hemra show` and the viewer: `tampered.json`."""
    evidence = {"schema_version": 1, "reason": str(failure), "evidence": list(failure.evidence)}
    write_durably(folder / "tampered.json", json.dumps(evidence, indent=2) + "\n")


def _outage_cause(
    failure: BaseException, context: TrialContext, progress: Progress
) -> Cause | None:
    """The cause of an infrastructure error that was not the trial's doing: its engine could
    not be reached, or stopped answering within HEMRA_ENGINE_SETTLE_SECS of refusing it (a
    daemon shutting down); or the runner's own disk (where its folder is) was full. An answer
    that did not come in time from an engine that still answers pings is not an outage: before
    the agent ran (its sandbox's start), the engine was busy, which no trial can shape (run
    again, no retry used); after, it was slow for what the trial left (a retry used)."""
    if is_engine_fault(failure):
        provider = context.pool or context.provider
        if is_slow_answer(failure) and settled(provider, progress.engine, 0) is None:
            # an engine overloaded with starts (`run/admission.py`), before the agent ran
            return Cause.ENGINE_BUSY if set(progress.phases) <= BEFORE_AGENT else None
        return Cause.ENGINE_OUTAGE
    if is_engine_answer(failure):
        provider = context.pool or context.provider
        if settled(provider, progress.engine, engine_settle_secs()) is not None:
            return Cause.ENGINE_OUTAGE
    if is_runner_disk_full(failure, context.trial_dir):
        return Cause.RUNNER_DISK_FULL
    return None


@contextmanager
def _placed(context: TrialContext, progress: Progress) -> Iterator[TrialContext]:
    """The trial bound to an engine of its pool for as long as its sandbox lives (no pool:
    the trial as it is). Waiting for a free slot is the `place` phase."""
    if context.pool is None:
        yield context
        return
    with ExitStack() as held:
        with progress.phase("place"):
            placement = held.enter_context(
                context.pool.place(context.trial_id, context.task, context.spec.sandbox.image)
            )
        progress.engine = placement.engine
        yield replace(context, provider=placement.provider, gateway_host=placement.gateway_host)


def _judge(context: TrialContext, reward: float | None) -> list[Judgment]:
    """Phase 4b: every judge scores the trial, after the verifier, out of the sandbox."""
    seen = material(context.task.instruction, reward, context.trial_dir)
    return [
        run_judge(
            judge,
            seen,
            gateway=context.gateway,
            trial_id=context.trial_id,
            run_id=context.run_id,
            keys=provider_keys(context),
            run_model=context.spec.model,
        )
        for judge in context.judges
    ]


def _classify(reward: float, progress: Progress) -> Outcome:
    if progress.timed_out:
        return Outcome.TIMEOUT
    if progress.exit_code != 0:
        return Outcome.HARNESS_ERROR
    if progress.pass_threshold is not None:
        return Outcome.PASS if reward >= progress.pass_threshold else Outcome.FAIL
    return Outcome.PASS if is_pass(reward) else Outcome.FAIL


def _run_in_sandbox(context: TrialContext, progress: Progress) -> tuple[float, dict[str, float]]:
    task, harness, folder = context.task, context.harness, context.trial_dir
    (folder / "agent").mkdir(exist_ok=True)
    (folder / "verifier").mkdir(exist_ok=True)
    with progress.phase("image"):
        image = context.provider.prepare(task, context.spec.sandbox.image)
        installed = ensure_installed(harness)
    environment = task.config.environment
    limits = task_limits(context.spec.sandbox, task)
    disk_mb = limits.disk_mb
    if disk_mb is None and "disk_limit" in context.provider.capabilities:
        disk_mb = limits.storage_mb  # the task's storage_mb, where the engine can hold to it
    request = SandboxRequest(
        image=image,
        limits=Limits(
            cpus=limits.cpus, memory_mb=limits.memory_mb, pids=limits.pids, disk_mb=disk_mb
        ),
        network=task.config.agent_network == "public",
        labels={"hemra.run": context.run_id, "hemra.trial": context.trial_id},
        name=f"hemra-{context.trial_id.replace('.', '-')}",
        mounts=installed.mounts if installed else (),
        gateway_port=gateway_port(context),
        proxy_port=proxy_port(context) if task.config.uses_proxy else None,
        output_cap=context.spec.sandbox.output_cap_mb << 20,
        pass_env=tuple(context.spec.sandbox.pass_env),
    )
    if not task.config.steps:  # in before it starts (a step's goes in at the step)
        files, folders = instruction_files(context, task.path, task.instruction)
        request = replace(request, files=files, folders=folders)
    _raise_if_stopped(context, "before its sandbox started")
    sandboxes = ExitStack()
    starts = admission(progress.engine or context.provider.engine or LOCAL_ENGINE)
    with progress.phase("start"), starts.start():
        try:  # a multi-container task's services first: the sandbox starts once they are up
            network = sandboxes.enter_context(_services(context, request))
            request = replace(request, services_network=network)
            sandbox = sandboxes.enter_context(context.provider.open(request))
        except BaseException:
            sandboxes.close()
            raise
    try:
        # stopped while its sandbox came up: the runner's removal may have missed it
        _raise_if_stopped(context, "as its sandbox started")
        with progress.phase("healthcheck"):
            healthy(context, sandbox, environment.healthcheck, "[environment] healthcheck")
        if task.config.steps:
            return _noting_offline(
                context, progress, lambda: run_steps(context, sandbox, progress, installed, request)
            )
        with progress.phase("setup"):  # the instruction went in as it started
            before = sandbox.read_start_tree(context.workdir)
        with progress.phase("agent"), model_access(context, progress) as access:
            run_agent(context, sandbox, progress, access, installed)
        if progress.usage.is_unreachable:
            raise InfraError("the model upstream was unreachable for the whole trial")
        # the engine's diff of the system, read beside the work folder's (it costs the engine)
        with _unwaited(ThreadPoolExecutor(1, thread_name_prefix="hemra-tamper")) as engine:
            evidence = engine.submit(tampering, context, sandbox)
            with progress.phase("diff"):
                after = sandbox.read_tree(context.workdir, since=before)
                write_diff(before, after, folder / "diff.patch")
                keep_tree_notes(after, context.workdir, folder)
                budget = FolderBudget(folder, context.spec.sandbox.folder_cap_mb << 20)
                if progress.agent_logs:
                    _keep_agent_logs(sandbox, folder / "agent" / "logs", budget)
                collect_artifacts(sandbox, task.config.artifacts, folder / "artifacts", budget)
                budget.note()
            with progress.phase("tamper"):
                raise_tampered(_tamper_evidence(evidence))
        with progress.phase("verifier"), verifier_room(context, sandbox, request) as room:
            hemra = task.config.hemra
            if hemra.track == "swe":
                return verify_swe(context, room, progress, before, after)
            if hemra.track == "open":
                return verify_open(context, room, progress, after)
            return _noting_offline(context, progress, lambda: verify_reward(context, room))
    except BaseException as failure:
        if is_runner_disk_full(failure, folder):  # noted now: the teardown may free space
            progress.cause = Cause.RUNNER_DISK_FULL
        raise
    finally:
        with progress.phase("teardown"):
            sandboxes.close()


def _raise_if_stopped(context: TrialContext, when: str) -> None:
    """A trial stopped (cancelled, interrupted) goes no further: what it opened is closed on
    the way out, and its runner records it cancelled."""
    if context.stopped.is_set():
        raise InfraError(f"the trial was stopped {when}")


def _noting_offline(
    context: TrialContext,
    progress: Progress,
    verify: Callable[[], tuple[float, dict[str, float]]],
) -> tuple[float, dict[str, float]]:
    """`verify`'s reward, the trial classed `verifier_offline` (`_note_offline`) when it fell
    short of a pass or its verifier gave none."""
    try:
        reward, rewards = verify()
    except VerifierError:
        _note_offline(context, progress)
        raise
    if not is_pass(reward):
        _note_offline(context, progress)
    return reward, rewards


def _note_offline(context: TrialContext, progress: Progress) -> None:
    """A verifier (the task's, or a step's) that failed with its network cut and printed a
    network error (a lookup, an unreachable address) classes the trial `verifier_offline`:
    reports flag it, as it may have failed for lack of a network rather than for the agent's
    work."""
    config = context.task.config
    verifiers = [(config.verifier, context.trial_dir / "verifier")]
    if config.steps:
        steps = context.trial_dir / "steps"
        verifiers = [
            (step.verifier, steps / f"{index + 1:02d}-{step.name}" / "verifier")
            for index, step in enumerate(config.steps)
        ]
    for settings, folder in verifiers:
        if verifier_network(context, settings) != "none":
            continue
        for name in ("stderr.txt", "stdout.txt"):
            path = folder / name
            if path.is_file():
                with path.open("rb") as handle:
                    handle.seek(max(path.stat().st_size - OUTPUT_TAIL_BYTES, 0))
                    if network_error(handle.read().decode(errors="replace")):
                        progress.cause = Cause.VERIFIER_OFFLINE
                        return


def _services(context: TrialContext, request: SandboxRequest) -> AbstractContextManager[str | None]:
    """A multi-container task's services (its compose file) running beside the trial, their
    network's name for the sandbox to join; None for a task without services."""
    compose = context.task.compose
    if compose is None or not compose.services:
        return nullcontext(None)
    return context.provider.open_services(context.task, request, context.trial_dir / "services")


def _keep_agent_logs(sandbox: Sandbox, target: Path, budget: FolderBudget) -> None:
    """What the harness wrote to /logs/agent (its own trajectory, say), into the trial folder,
    as far as the folder's budget goes (what did not fit is named in `folder-cap.json`)."""
    for name, content in sandbox.read_tree(AGENT_LOGS).items():
        path = (target / name).resolve()
        if target.resolve() in path.parents:  # names come from the sandbox: stay inside
            if not budget.take(f"agent/logs/{name}", len(content)):
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
