"""One agent turn in a trial's sandbox: its health checked, the instruction (and, for the
oracle, the solution) put in, model access through a gateway token, the harness's files, the
task's skills, its installs and command run as the agent's user, and the sandbox emptied after
it (by the kernel: `Sandbox.empty`) that leaves the verifier a clean room.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from pytest_hemra.core.errors import InfraError, VerifierError
from pytest_hemra.execute.context import (
    Progress,
    TrialContext,
)
from pytest_hemra.execute.gateway.egress import proxy_env
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
from pytest_hemra.execute.installs import HARNESS_DIR, Installed
from pytest_hemra.execute.kinds import AgentTurn, kind_of
from pytest_hemra.execute.mcp import claude_json, codex_toml
from pytest_hemra.execute.sandbox import (
    AGENT_USER,
    ROOT_USER,
    Sandbox,
    Tree,
)
from pytest_hemra.execute.selfreport import parse_output
from pytest_hemra.execute.trajectory import build_trajectory
from pytest_hemra.resolve.datasets import Task
from pytest_hemra.resolve.harness_spec import HarnessSpec
from pytest_hemra.resolve.harnesses import render, render_argv
from pytest_hemra.resolve.taskconfig import Healthcheck
from pytest_hemra.score.room import (
    EMPTY_ROOM,
    cut_network,
    end_around_keeper,
    is_separate,
    run_root,
)
from pytest_hemra.score.verification import provider_keys, runner_env

INSTRUCTION_FILE = "/hemra/instruction.md"
AGENT_LOGS = "/logs/agent"
# after the sandbox is emptied, as root: says whether the harness left anything in /logs/agent
# (shell builtins only), so an empty one is not read back (a round trip to the engine saved)
AGENT_LOGS_SAID = f"""
for entry in {AGENT_LOGS}/* {AGENT_LOGS}/.[!.]* {AGENT_LOGS}/..?*; do
  if [ -e "$entry" ] || [ -L "$entry" ]; then echo +agent-logs; break; fi
done
"""


def healthy(context: TrialContext, sandbox: Sandbox, check: Healthcheck | None, where: str) -> None:
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


def instruction_files(
    context: TrialContext, folder: Path, text: str
) -> tuple[dict[str, bytes], dict[str, Path]]:
    """The instruction file, and the solution for a harness that uses it (the oracle): the
    files and folders to put in (root's, read-only for the agent)."""
    solution = folder / "solution"
    use = context.harness.spec.uses_solution and solution.is_dir()
    return {INSTRUCTION_FILE: text.encode()}, {"/solution": solution} if use else {}


def put_instruction(context: TrialContext, sandbox: Sandbox, folder: Path, text: str) -> None:
    """`instruction_files` in at once (a step's: the first sandbox took its task's at start)."""
    sandbox.put(*instruction_files(context, folder, text))


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
def model_access(context: TrialContext, progress: Progress) -> Iterator[dict[str, str]]:
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


def keep_tree_notes(tree: Tree, path: str, folder: Path) -> None:
    """What the bounded read of the work folder left out (files over the cap, a cap reached),
    as `tree-notes.json` beside the diff."""
    notes = tree.notes()
    if notes is not None:
        (folder / "tree-notes.json").write_text(json.dumps({"path": path, **notes}, indent=1))


def run_agent(
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
        task_env |= context.render(context.task.config.solution.env)
    env = {
        **task_env,
        "HOME": identity.home,
        "HEMRA_DEADLINE": str(int(deadline)),
        "HEMRA_TIMEOUT_SECS": str(int(timeout)),
        "HEMRA_INSTRUCTION_FILE": INSTRUCTION_FILE,
        "HEMRA_MODEL": values["model"],
        "HEMRA_BASE_URL": values["base_url"],
        "HEMRA_API_KEY": values["api_key"],
        **proxy_env(values["proxy_url"], context.direct_hosts),
        **({"PATH": installed.path} if installed else {}),
        **{name: runner_env(name) for name in spec.env},
        **{render(name, values): render(value, values) for name, value in spec.environment.items()},
    }
    kept = context.keeps_processes
    # what listens before the turn: only the image's services can (else PID 1 alone runs)
    listening = (
        None if kept else (sandbox.listening_ports() if sandbox.runs_services else frozenset())
    )
    try:
        _take_turn(context, sandbox, progress, values, env, deadline, identity)
    finally:  # exit, timeout or error: nothing the agent started outlives its turn
        if kept:  # unless its task's tests need it running (`resolve/processes.py`)
            progress.agent_logs = _clear_room(context, sandbox)
        else:
            after = sandbox.listening_ports() if listening is not None else None
            if listening is not None and after:
                progress.killed_listeners = tuple(sorted(after - listening))
            progress.agent_logs = empty_room(context, sandbox, identity)


def empty_room(context: TrialContext, sandbox: Sandbox, identity: Identity) -> bool:
    """After an agent's turn: the sandbox emptied by the kernel (killed whole, started again),
    the verifier's network cut while it is stopped (cheaper than on a running one) for a
    one-step task verified in it, the task's services healthy again, then, as root, /tests
    removed and /logs/verifier a new empty folder (EMPTY_ROOM). Whether /logs/agent holds
    anything is returned. A room that cannot be made clean for what the agent left in it is
    the trial's failure (VerifierError), never the engine's. A one-step task verified in a
    separate room leaves the sandbox halted: only its files are read from then on (through
    the engine), so it is not started again. A non-root agent's processes are all its user's
    (no-new-privileges: it cannot become another), so they are killed by the kernel as that
    user and seen gone by the engine (`end_user`), and the sandbox keeps running: its PID 1
    and the image's entrypoint, root's, which that agent can neither signal nor trace, are
    untouched (an entrypoint's state stays as Harbor leaves it); only when that fails is the
    sandbox emptied whole. A sandbox whose PID 1 is HEMRA's keeper (no ENTRYPOINT, perl in the
    image: `keeper.py`), which nothing in the sandbox can trace, write or signal, is emptied
    from this host whoever the agent ran as, every process but PID 1 killed while its cgroup
    is frozen (`end_all_but_init`, no engine request), and runs on: a root agent's gets no
    second start, a non-root agent's no listing and kill through the engine."""
    if not is_separate(context) and end_around_keeper(context, sandbox, "after the agent's turn"):
        return _clear_room(context, sandbox)  # PID 1 the keeper: the sandbox runs on
    if not identity.is_root and sandbox.end_user(identity.user):
        return _clear_room(context, sandbox)
    sandbox.halt()
    if not context.task.config.steps:
        if is_separate(context):
            return True  # /logs/agent read through the engine, whether it holds anything or not
        cut_network(context, sandbox, context.task.config.verifier)
        if _starts_with_the_tests(context, sandbox):
            return True  # its files read from storage; the tests go in before it starts again
    sandbox.empty()
    if sandbox.runs_services:  # the entrypoint ran again: its services come back fresh
        try:
            check = context.task.config.environment.healthcheck
            healthy(context, sandbox, check, "[environment] healthcheck, after the agent")
        except InfraError as error:
            raise VerifierError(f"after the agent's turn: {error}") from error
    return _clear_room(context, sandbox)


def _starts_with_the_tests(context: TrialContext, sandbox: Sandbox) -> bool:
    """A one-step reward-track task in the shared room whose halted sandbox is read from the
    engine's storage (no services to bring back) stays halted until its verifier: the tests
    are then written into its storage and it starts once, with them (`_run_test_sh`)."""
    track = context.task.config.hemra.track
    return track == "reward" and sandbox.reads_storage and not sandbox.runs_services


def _clear_room(context: TrialContext, sandbox: Sandbox) -> bool:
    """EMPTY_ROOM and AGENT_LOGS_SAID as root in one command, once nothing of the agent's runs:
    whether /logs/agent holds anything. Not run where test.sh's own command clears the room
    (`ENTER_TESTS`) and /logs/agent is read from the engine's storage (free when empty)."""
    if sandbox.reads_storage and context.task.config.hemra.track == "reward":
        return True
    log = context.trial_dir / "agent" / "room.txt"
    said = run_root(sandbox, EMPTY_ROOM + AGENT_LOGS_SAID, log, failure=VerifierError)
    log.unlink(missing_ok=True)
    return "+agent-logs" in said.splitlines()


def _place_skills(
    context: TrialContext, sandbox: Sandbox, values: dict[str, str], identity: Identity, err: Path
) -> None:
    """The task's `skills_dir` (a folder of its image) copied, as the agent's user, to where the
    harness loads skills from (its `skills_dir`). A copy that fails is the task's fault (a
    verifier_error, never scored against the harness)."""
    source, target = context.task.config.environment.skills_dir, context.harness.spec.skills_dir
    if source is None or target is None:
        return
    result = sandbox.exec(
        ["sh", "-c", 'mkdir -p "$2" && cp -R "$1"/. "$2"/', "sh", source, render(target, values)],
        user=identity.user,
        env={},
        timeout=60,
        stdout=err,
        stderr=err,
        workdir="/",
    )
    if result.exit_code != 0 or result.timed_out:
        tail = err.read_text(errors="replace").strip()[-200:] if err.is_file() else ""
        raise VerifierError(
            f"{context.task.path / 'task.toml'}: key 'environment.skills_dir': {source} could not"
            f" be copied for the agent ({tail})"
        )


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
    _place_skills(context, sandbox, values, identity, err)
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
