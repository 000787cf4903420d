"""One trial, start to result: sandbox, harness, diff, verifier, reward, outcome, trial folder.

An outcome is a value: a harness that fails, crashes or times out is a result (and still
verified). Exceptions are for infrastructure, and `errors.outcome_of` maps them to outcomes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from urllib.parse import urlsplit

from pytest_hemra.core.errors import HemraError, InfraError, VerifierError, outcome_of
from pytest_hemra.core.network import OUTPUT_TAIL_BYTES, network_error
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.reward import is_pass
from pytest_hemra.execute.artifacts import collect as collect_artifacts
from pytest_hemra.execute.context import (
    Progress,
    StepResult,
    TrialContext,
    TrialResult,
)
from pytest_hemra.execute.diff import tree_diff
from pytest_hemra.execute.gateway.ledger import CallPolicy
from pytest_hemra.execute.gateway.scripted import (
    NO_EDITS,
    Script,
    ShellStep,
    default_script,
    load_edits,
    load_script,
)
from pytest_hemra.execute.healthcheck import wait_healthy
from pytest_hemra.execute.identity import Identity, agent_identity
from pytest_hemra.execute.installs import HARNESS_DIR, Installed, ensure_installed
from pytest_hemra.execute.kinds import AgentTurn, kind_of
from pytest_hemra.execute.mcp import claude_json, codex_toml
from pytest_hemra.execute.sandbox import (
    AGENT_USER,
    ROOT_USER,
    Limits,
    Sandbox,
    SandboxRequest,
    Tree,
)
from pytest_hemra.execute.sandbox.processes import baseline_of, sweep
from pytest_hemra.execute.selfreport import parse_output
from pytest_hemra.execute.trajectory import build_trajectory
from pytest_hemra.resolve.datasets import Task
from pytest_hemra.resolve.harnesses import render, render_argv
from pytest_hemra.resolve.judges import Judgment
from pytest_hemra.resolve.limits import task_limits, with_run_defaults
from pytest_hemra.resolve.spec import HarnessSpec
from pytest_hemra.resolve.taskconfig import Healthcheck, render_env
from pytest_hemra.score.judges import material, run_judge
from pytest_hemra.score.verification import (
    EMPTY_ROOM,
    provider_keys,
    runner_env,
    verifier_network,
    verifier_room,
    verify_open,
    verify_reward,
    verify_step,
    verify_swe,
)

INSTRUCTION_FILE = "/hemra/instruction.md"
VERIFIER_OFFLINE = "verifier_offline"  # the class of a trial whose verifier lacked a network
AGENT_LOGS = "/logs/agent"
# after the sweep, as root: says whether the harness left anything in /logs/agent (shell
# builtins only), so an empty one is not read back (a round trip to the engine saved)
AGENT_LOGS_SAID = f"""
for entry in {AGENT_LOGS}/* {AGENT_LOGS}/.[!.]* {AGENT_LOGS}/..?*; do
  if [ -e "$entry" ] || [ -L "$entry" ]; then echo +agent-logs; break; fi
done
"""


def run_trial(context: TrialContext) -> TrialResult:
    """Run one trial to a result; never raises for anything a trial can end in."""
    context = replace(context, task=with_run_defaults(context.spec.sandbox, context.task))
    started_at = time.time()
    clock = time.monotonic()
    context.trial_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    reward: float | None = None
    rewards: dict[str, float] = {}
    error: str | None = None
    retried = False
    try:
        with _placed(context, progress) as placed:
            reward, rewards = _run_in_sandbox(placed, progress)
        outcome = _classify(reward, progress)
    except HemraError as failure:
        outcome, retried = outcome_of(failure)
        error = str(failure)
    except Exception as failure:  # anything unexpected under a trial is infrastructure
        outcome, retried = outcome_of(failure)
        error = f"{type(failure).__name__}: {failure}"
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
        error_class=progress.error_class,
        steps=progress.steps,
        engine=progress.engine,
        agent_user=progress.agent_user,
    )
    result.judgments = list(progress.judgments)
    if context.judges and result.is_scored:
        with progress.phase("judges"):
            result.judgments += _judge(context, reward)
        result.finished_at = time.time()
        result.duration = round(time.monotonic() - clock, 4)
    (context.trial_dir / "result.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    return result


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
        proxy_port=proxy_port(context) if task.config.agent_hosts else None,
    )
    sandboxes = ExitStack()
    with progress.phase("start"):
        try:  # a multi-container task's services first: the sandbox starts once they are up
            network = sandboxes.enter_context(_services(context, request))
            request = replace(request, services_network=network)
            sandbox = sandboxes.enter_context(context.provider.open(request))
        except BaseException:
            sandboxes.close()
            raise
    try:
        with progress.phase("healthcheck"):
            _healthy(context, sandbox, environment.healthcheck, "[environment] healthcheck")
        if task.config.steps:
            return _run_steps(context, sandbox, progress, installed, request)
        with progress.phase("setup"):
            _put_instruction(context, sandbox, task.path, task.instruction)
            before = sandbox.read_start_tree(context.workdir)
        with progress.phase("agent"), _model_access(context, progress) as access:
            _run_agent(context, sandbox, progress, access, installed)
        if progress.usage.is_unreachable:
            raise InfraError("the model upstream was unreachable for the whole trial")
        with progress.phase("diff"):
            after = sandbox.read_tree(context.workdir)
            (folder / "diff.patch").write_text(tree_diff(before, after))
            _keep_tree_notes(after, context.workdir, folder)
            if progress.agent_logs:
                _keep_agent_logs(sandbox, folder / "agent" / "logs")
            collect_artifacts(sandbox, task.config.artifacts, folder / "artifacts")
        with progress.phase("verifier"), verifier_room(context, sandbox, request) as room:
            hemra = task.config.hemra
            if hemra.track == "swe":
                return verify_swe(context, room, progress, before, after)
            if hemra.track == "open":
                return verify_open(context, room, progress, after)
            try:
                reward, rewards = verify_reward(context, room)
            except VerifierError:
                _note_offline(context, progress)
                raise
            if not is_pass(reward):
                _note_offline(context, progress)
            return reward, rewards
    finally:
        with progress.phase("teardown"):
            sandboxes.close()


def _note_offline(context: TrialContext, progress: Progress) -> None:
    """A verifier that failed with its network cut and printed a network error (a lookup, an
    unreachable address) is classed `verifier_offline`: reports flag it, as it may have failed
    for lack of a network rather than for the agent's work."""
    if verifier_network(context, context.task.config.verifier) != "none":
        return
    folder = context.trial_dir / "verifier"
    for name in ("stderr.txt", "stdout.txt"):
        path = folder / name
        if path.is_file():
            with path.open("rb") as handle:
                handle.seek(max(path.stat().st_size - OUTPUT_TAIL_BYTES, 0))
                if network_error(handle.read().decode(errors="replace")):
                    progress.error_class = VERIFIER_OFFLINE
                    return


def _services(context: TrialContext, request: SandboxRequest) -> AbstractContextManager[str | None]:
    """A multi-container task's services (its compose file) running beside the trial, their
    network's name for the sandbox to join; None for a task without services."""
    compose = context.task.compose
    if compose is None or not compose.services:
        return nullcontext(None)
    open_services = getattr(context.provider, "open_services", None)
    if open_services is None:
        raise InfraError(
            f"{compose.path}: the {context.provider.name} sandbox provider cannot run a task's"
            " compose services"
        )
    opened: AbstractContextManager[str | None] = open_services(
        context.task, request, context.trial_dir / "services"
    )
    return opened


def _healthy(
    context: TrialContext, sandbox: Sandbox, check: Healthcheck | None, where: str
) -> None:
    """Wait for the task's (or a step's) healthcheck to pass; an unhealthy sandbox raises."""
    if check is not None:
        wait_healthy(
            sandbox,
            check,
            env=context.task_env(),
            workdir=context.workdir,
            log=context.trial_dir / "healthcheck.txt",
            where=f"{context.task.path / 'task.toml'}: {where}",
        )


def _put_instruction(context: TrialContext, sandbox: Sandbox, folder: Path, text: str) -> None:
    """The instruction file, and the solution for a harness that uses it (the oracle), in at
    once: root's, read-only for the agent."""
    solution = folder / "solution"
    use = context.harness.spec.uses_solution and solution.is_dir()
    sandbox.put({INSTRUCTION_FILE: text.encode()}, {"/solution": solution} if use else {})


def gateway_port(context: TrialContext) -> int | None:
    """The port the trial's gateway listens on where its sandbox reaches it (None: no gateway),
    the one port of the runner's machine the sandbox's network lets it reach."""
    gateway = context.gateway
    url = gateway.base_urls.get(context.gateway_host) if gateway is not None else None
    return urlsplit(url).port if url else None


def proxy_port(context: TrialContext) -> int | None:
    """The port of the gateway's egress proxy where the trial's sandbox reaches it."""
    gateway = context.gateway
    url = gateway.egress.urls.get(context.gateway_host) if gateway is not None else None
    return urlsplit(url).port if url else None


@contextmanager
def _model_access(context: TrialContext, progress: Progress) -> Iterator[dict[str, str]]:
    """A gateway token for the agent phase: its base URL and key, ended when the agent is;
    and, for a task with a host allowlist, its egress proxy's URL and credential, ended too
    (what it reached and was refused kept in `agent/egress.json`)."""
    gateway = context.gateway
    if gateway is None:
        yield {"base_url": "", "host_base_url": "", "api_key": "", "proxy_url": ""}
        return
    hosts = context.task.config.agent_hosts
    egress = gateway.egress.open(context.trial_id, hosts) if hosts else None
    keys = provider_keys(context)
    limits = context.spec.gateway
    access = gateway.open_trial(
        context.trial_id,
        context.run_id,
        provider=context.harness.spec.provider,
        keys=keys,
        script=script_for(context.task, context.harness.spec),
        calls_dir=context.trial_dir / "calls",
        policy=CallPolicy(
            model=context.spec.model,
            refuse_other_models=limits.other_models == "refuse",
            max_tokens=limits.trial_max_tokens,
            max_cost_usd=limits.trial_max_cost_usd,
        ),
        budget=context.budget,
    )
    try:
        yield {
            "base_url": access.base_url(context.gateway_host),
            "host_base_url": access.base_url("127.0.0.1"),
            "api_key": access.token,
            "proxy_url": gateway.egress.proxy_url(egress, context.gateway_host) if egress else "",
        }
    finally:
        if egress is not None:
            gateway.egress.close(egress)
            egress.write(context.trial_dir / "agent" / "egress.json")
        progress.usage = gateway.close_trial(access.token)
        calls = gateway.calls(access.token)
        if calls:
            trajectory = build_trajectory(context.trial_dir / "calls", calls)
            (context.trial_dir / "trajectory.json").write_text(json.dumps(trajectory, indent=1))


def proxy_env(proxy_url: str, gateway_host: str) -> dict[str, str]:
    """An allowlist task's agent: every HTTP(S) client pointed at the egress proxy (both
    spellings: curl reads only the lower-case `http_proxy`), the gateway itself reached
    directly."""
    if not proxy_url:
        return {}
    proxies = {name: proxy_url for name in ("HTTP_PROXY", "HTTPS_PROXY")}
    return {
        **proxies,
        **{name.lower(): url for name, url in proxies.items()},
        "NO_PROXY": gateway_host,
        "no_proxy": gateway_host,
    }


def script_for(task: Task, harness: HarnessSpec) -> Script:
    """What the scripted model plays for a task: `solution/scripted.toml`, else solve.sh, then
    the harness's `finish_command` (for agents that end by a command, not by a message).

    A harness with an `edit_format` has no tools to run either: it gets `solution/edits.toml`'s
    files in one reply, or, for a task without one, a reply saying there are no edits."""
    if harness.edit_format is not None:
        edits = task.path / "solution" / "edits.toml"
        return load_edits(edits) if edits.is_file() else (NO_EDITS,)
    transcript = task.path / "solution" / "scripted.toml"
    if transcript.is_file():
        return load_script(transcript)
    if not task.has_solution:
        return ()
    solve, final = default_script((task.path / "solution" / "solve.sh").read_text())
    finish = harness.finish_command
    return (solve, ShellStep(finish), final) if finish else (solve, final)


def _keep_tree_notes(tree: Tree, path: str, folder: Path) -> None:
    """What the bounded read of the work folder left out (files over the cap, a cap reached),
    as `tree-notes.json` beside the diff."""
    notes = tree.notes()
    if notes is not None:
        (folder / "tree-notes.json").write_text(json.dumps({"path": path, **notes}, indent=1))


def _keep_agent_logs(sandbox: Sandbox, target: Path) -> None:
    """What the harness wrote to /logs/agent (its own trajectory, say), into the trial folder."""
    for name, content in sandbox.read_tree(AGENT_LOGS).items():
        path = (target / name).resolve()
        if target.resolve() in path.parents:  # names come from the sandbox: stay inside
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)


def _run_agent(
    context: TrialContext,
    sandbox: Sandbox,
    progress: Progress,
    access: dict[str, str],
    installed: Installed | None,
) -> None:
    timeout = context.agent_timeout
    identity = agent_identity(
        context.task,
        context.spec.sandbox.agent_user,
        sandbox,
        context.trial_dir / "agent" / "user.txt",
    )
    progress.agent_user = identity.describe()
    if identity.user != AGENT_USER and not identity.is_root:  # the work folder is made its own
        _give_workdir(context, sandbox, identity)
    deadline = time.time() + timeout
    values = {
        **access,
        "instruction": context.task.instruction,
        "instruction_file": INSTRUCTION_FILE,
        "model": context.spec.model or context.harness.spec.model or "",
        "workdir": context.workdir,
        "logs_dir": AGENT_LOGS,
        "deadline": str(int(deadline)),
        "timeout_secs": str(int(timeout)),
        "harness_dir": HARNESS_DIR if installed else "",
        "home": identity.home,
        "mcp_servers_json": claude_json(context.task.config.environment.mcp_servers),
        "mcp_servers_toml": codex_toml(context.task.config.environment.mcp_servers),
    }
    spec = context.harness.spec
    task_env = context.task_env()
    if spec.uses_solution:  # the oracle runs the solution: it sees [solution] env too
        task_env |= render_env(context.task.config.solution.env, dict(os.environ))
    env = {
        **task_env,
        "HOME": identity.home,
        "HEMRA_DEADLINE": str(int(deadline)),
        "HEMRA_TIMEOUT_SECS": str(int(timeout)),
        "HEMRA_INSTRUCTION_FILE": INSTRUCTION_FILE,
        "HEMRA_MODEL": values["model"],
        "HEMRA_BASE_URL": values["base_url"],
        "HEMRA_API_KEY": values["api_key"],
        **proxy_env(values["proxy_url"], context.gateway_host),
        **({"PATH": installed.path} if installed else {}),
        **{name: runner_env(name) for name in spec.env},
        **{render(name, values): render(value, values) for name, value in spec.environment.items()},
    }
    baseline = baseline_of(sandbox)  # PID 1 and the task's own services
    try:
        _take_turn(context, sandbox, progress, values, env, deadline, identity)
    finally:  # exit, timeout or error: nothing the agent started outlives its turn
        swept = sweep(
            sandbox,
            baseline,
            context.trial_dir / "agent" / "leftovers.txt",
            then=EMPTY_ROOM + AGENT_LOGS_SAID,
        )
        progress.agent_logs = "agent-logs" in swept.said


def _give_workdir(context: TrialContext, sandbox: Sandbox, identity: Identity) -> None:
    """The work folder and /logs/agent owned by the agent's user, as the sandbox layer makes
    them HEMRA's agent's (uid 1000) for a user of the task's own."""
    log = context.trial_dir / "agent" / "user.txt"
    result = sandbox.exec(
        ["chown", "-R", identity.user, context.workdir, AGENT_LOGS],
        user=ROOT_USER,
        env={},
        timeout=60,
        stdout=log,
        stderr=log,
        workdir="/",
    )
    if result.exit_code != 0:
        raise InfraError(f"sandbox: cannot give {context.workdir} to the agent's user {identity}")


def _take_turn(
    context: TrialContext,
    sandbox: Sandbox,
    progress: Progress,
    values: dict[str, str],
    env: dict[str, str],
    deadline: float,
    identity: Identity,
) -> None:
    """The agent's turn proper: the harness's files, its install commands, then its command."""
    spec, timeout = context.harness.spec, context.agent_timeout
    logs = context.trial_dir / "agent"
    out, err = logs / "stdout.txt", logs / "stderr.txt"
    for path, content in spec.files.items():
        target = render(path, values)
        try:  # as the agent user, never through the engine (which writes as root)
            sandbox.write_file(target, render(content, values).encode(), user=identity.user)
        except OSError as error:
            with err.open("a") as handle:
                handle.write(f"hemra: [files] {target}: {error}\n")
            progress.exit_code, progress.timed_out = 1, False
            return
    for argv in context.harness.spec.install:
        setup = sandbox.exec(
            render_argv(argv, values),
            user=identity.user,
            env=env,
            timeout=timeout,
            stdout=out,
            stderr=err,
            workdir=context.workdir,
        )
        if setup.timed_out or setup.exit_code != 0:
            progress.exit_code, progress.timed_out = setup.exit_code, setup.timed_out
            return
    argv = render_argv(spec.command, values)
    turn = AgentTurn(
        context.harness,
        sandbox,
        argv,
        values,
        env,
        context.task.instruction,
        deadline,
        out,
        err,
        context.workdir,
        identity.user,
        tuple(context.task.config.environment.mcp_servers),
    )
    result = kind_of(context.harness).run_agent(turn)
    progress.exit_code, progress.timed_out = result.exit_code, result.timed_out
    if spec.output:
        text = out.read_text(errors="replace")
        if spec.output_file:  # the harness writes its own numbers to a file, not stdout
            try:  # as the agent user: the harness reads only what it could have written
                found = sandbox.read_file(render(spec.output_file, values), user=identity.user)
            except OSError:
                found = b""
            text = found.decode(errors="replace")
        progress.own_report = parse_output(spec.output, text)


def _run_steps(
    context: TrialContext,
    sandbox: Sandbox,
    progress: Progress,
    installed: Installed | None,
    request: SandboxRequest,
) -> tuple[float, dict[str, float]]:
    """A multi-step task: each step's files (`workdir/` into the work folder, the agent's; its
    `setup.sh` run as root), its healthcheck, its instruction and agent turn in the same
    sandbox, then its verifier (the task's tests/ with the step's over them, the step's
    `[steps.verifier]` settings) and its artifacts. A step whose rewards miss its `min_reward`
    ends the task: the later steps are skipped, recorded as such, and score 0. The reward rolls
    up by the task's `multi_step_reward_strategy`: the mean of the steps, or the last one's."""
    task, folder, workdir = context.task, context.trial_dir, context.workdir
    before_all = sandbox.read_start_tree(workdir)
    gate: str | None = None
    for index, step in enumerate(task.config.steps):
        step_dir = folder / "steps" / f"{index + 1:02d}-{step.name}"
        if gate is not None:
            progress.steps.append(StepResult(step.name, 0.0, {}, None, False, 0.0, gate))
            continue
        started = time.monotonic()
        step_path = task.path / "steps" / step.name
        (step_dir / "agent").mkdir(parents=True, exist_ok=True)
        (step_dir / "verifier").mkdir(exist_ok=True)
        instruction = (step_path / "instruction.md").read_text(encoding="utf-8")
        step_task = replace(task, path=step_path, instruction=instruction)
        step_context = replace(
            context, task=step_task, trial_dir=step_dir, step_timeout=step.agent.timeout_sec
        )
        with progress.phase(f"step {step.name}"):
            _prepare_step(context, sandbox, step_path, step_dir)
            _healthy(step_context, sandbox, step.healthcheck, f"steps {step.name} healthcheck")
            _put_instruction(context, sandbox, step_path, instruction)
            before = sandbox.read_tree(workdir)
            turn = Progress()
            with _model_access(step_context, turn) as access:
                _run_agent(step_context, sandbox, turn, access, installed)
            progress.usage = progress.usage.combined(turn.usage)
            progress.agent_user = turn.agent_user
            after = sandbox.read_tree(workdir)
            (step_dir / "diff.patch").write_text(tree_diff(before, after))
            _keep_tree_notes(after, workdir, step_dir)
            reward: float | None = None
            rewards: dict[str, float] = {}
            error: str | None = None
            try:
                with verifier_room(context, sandbox, request) as room:
                    reward, rewards = verify_step(
                        context, room, task.path, step_path, step_dir, step.verifier
                    )
            except VerifierError as failure:
                error = str(failure)
            collect_artifacts(
                sandbox, [*task.config.artifacts, *step.artifacts], step_dir / "artifacts"
            )
        progress.steps.append(
            StepResult(
                step.name,
                reward,
                rewards,
                turn.exit_code,
                turn.timed_out,
                round(time.monotonic() - started, 4),
                error,
            )
        )
        if error is None and step.falls_short(rewards, reward):
            gate = f"skipped: step {step.name} scored below its min_reward {step.min_reward}"
        progress.timed_out = progress.timed_out or turn.timed_out
        if progress.exit_code in (None, 0):
            progress.exit_code = turn.exit_code
    (folder / "diff.patch").write_text(tree_diff(before_all, sandbox.read_tree(workdir)))
    failed = [s for s in progress.steps if s.reward is None]
    if failed:
        raise VerifierError(f"step {failed[0].name}: {failed[0].error}")
    scores = [s.reward or 0.0 for s in progress.steps]
    if task.config.multi_step_reward_strategy == "final":
        reward = scores[-1]
    else:
        reward = sum(scores) / len(scores)
    return reward, {"reward": reward, **{f"step:{s.name}": s.reward or 0.0 for s in progress.steps}}


def _prepare_step(context: TrialContext, sandbox: Sandbox, step_path: Path, step_dir: Path) -> None:
    """A step's `workdir/` copied into the work folder (the agent's to change), then its
    `setup.sh` run as root in the work folder; a setup that fails is the task's fault (a
    verifier_error), not the agent's."""
    files = step_path / "workdir"
    if files.is_dir():
        log = step_dir / "agent" / "user.txt"
        identity = agent_identity(context.task, context.spec.sandbox.agent_user, sandbox, log)
        sandbox.put({}, {context.workdir: files}, owner=identity.user)
    setup = step_path / "setup.sh"
    if setup.is_file():
        log = step_dir / "setup.txt"
        result = sandbox.exec(
            ["bash", "-c", setup.read_text(encoding="utf-8")],
            user=ROOT_USER,
            env={"HOME": "/root", **context.task_env()},
            timeout=context.spec.sandbox.verifier_timeout_sec,
            stdout=log,
            stderr=log,
            workdir=context.workdir,
        )
        if result.timed_out or result.exit_code != 0:
            tail = log.read_text(errors="replace").strip()[-200:] if log.is_file() else ""
            ended = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise VerifierError(f"{setup}: failed ({ended}){': ' + tail if tail else ''}")
