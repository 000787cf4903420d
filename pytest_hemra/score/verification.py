"""Scoring a trial in its sandbox, by the task's track: the verifier's reward file, the SWE
track's hidden tests, the open-ended track's checks and rubric judge, one step of a multi-step
task. Each returns (reward, every reward key) and notes on the trial's progress what it learned
(an error class, a pass threshold, a judgment)."""

from __future__ import annotations

import io
import itertools
import os
import secrets
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path, PurePosixPath

from pytest_hemra.core.errors import HemraError, InfraError, Tampered, VerifierError
from pytest_hemra.core.outcome import SweClass
from pytest_hemra.core.reward import parse_reward
from pytest_hemra.core.trial import Judgment, TrialUsage
from pytest_hemra.execute.context import Progress, TrialContext
from pytest_hemra.execute.gateway.egress import proxy_env
from pytest_hemra.execute.identity import verifier_identity
from pytest_hemra.execute.sandbox import ROOT_USER, Sandbox, SandboxRequest
from pytest_hemra.resolve.limits import task_limits
from pytest_hemra.resolve.taskconfig import TaskVerifier
from pytest_hemra.resolve.verifier_environment import verifier_task
from pytest_hemra.score import openended, swe
from pytest_hemra.score.judges import JudgeCall, ask_model, with_usage
from pytest_hemra.score.model_access import verifier_model
from pytest_hemra.score.provenance import check_rewards, declared_kinds, refuse_planted

TESTS_DIR = "/tests"
VERIFIER_LOGS = "/logs/verifier"
CLEAR_SECS = 30.0
MAX_ROOM_COPY_BYTES = 4 << 30  # the most of the agent's /app a separate room receives

# run as root once the agent's processes are gone (`run/turn.empty_room`): no /tests (a
# root agent could have planted one), and /logs/verifier a new empty folder of root's (an old
# one, whoever filled it, is moved aside whole, then removed as far as root may)
EMPTY_ROOM = f"""set -e
rm -rf {TESTS_DIR}
[ ! -e {TESTS_DIR} ] && [ ! -L {TESTS_DIR} ]
old=/logs/.verifier-old-$$
if [ -e {VERIFIER_LOGS} ] || [ -L {VERIFIER_LOGS} ]; then mv {VERIFIER_LOGS} "$old"; fi
mkdir -m 0755 {VERIFIER_LOGS}
rm -rf "$old" 2>/dev/null || true
"""


# test.sh's own command: the tests, put in a folder of a name no one knows, moved to /tests
# (where the agent may have left one) and /logs/verifier made new, then test.sh; one command,
# where clearing the room first was a round trip of its own (~50 ms a trial)
STAGED_TESTS = f"""{EMPTY_ROOM}
mv "$1{TESTS_DIR}" {TESTS_DIR}
rmdir "$1"
"""
ENTER_TESTS = f"""{STAGED_TESTS}
set +e
exec bash {TESTS_DIR}/test.sh
"""
# a verifier that is not root: the room made as above, the tests and /logs/verifier its own
HAND_OVER = f"""{STAGED_TESTS}
chown -R "$2" {TESTS_DIR} {VERIFIER_LOGS}
"""


def verify_reward(context: TrialContext, sandbox: Sandbox) -> tuple[float, dict[str, float]]:
    folder = context.trial_dir / "verifier"
    tests, settings = [context.task.path / "tests"], context.task.config.verifier
    logs = _run_test_sh(context, sandbox, tests, folder, settings)
    check_rewards(logs, declared_kinds(tests, settings.env.values()))
    return parse_reward(logs, context.reward_keys)


def verify_step(
    context: TrialContext,
    sandbox: Sandbox,
    task_path: Path,
    step_path: Path,
    step_dir: Path,
    settings: TaskVerifier,
) -> tuple[float, dict[str, float]]:
    """One step's verifier (its `[steps.verifier]` settings): the task's tests/, the step's
    over them. The tests and the verifier's logs are removed after it, so the next step's agent
    never sees them."""
    tests = [path / "tests" for path in (task_path, step_path) if (path / "tests").is_dir()]
    env = {**context.task.config.verifier.env, **settings.env}
    user = settings.user if settings.user is not None else context.task.config.verifier.user
    try:
        logs = _run_test_sh(
            context,
            sandbox,
            tests,
            step_dir / "verifier",
            settings.model_copy(update={"env": env, "user": user}),
        )
    finally:
        sandbox.empty()  # halted to read its rewards: started again for the next step
        run_root(sandbox, EMPTY_ROOM, step_dir / "verifier" / "clear.txt")
        sandbox.reconnect_network()
    check_rewards(logs, declared_kinds(tests, env.values()))
    return parse_reward(logs, context.reward_keys)


def verifier_network(context: TrialContext, settings: TaskVerifier) -> str:
    """The verifier's network: the task's (or step's) `[verifier] network_mode` when it sets
    one ("no-network": none, "public": the sandbox's, "allowlist": its hosts through the egress
    proxy), else the run's `[verifier] network`."""
    if settings.network_mode == "no-network":
        return "none"
    if settings.network_mode == "allowlist":
        return "none" if context.gateway is None else "allowlist"
    if settings.network_mode == "public":
        return "bridge"
    return context.spec.verifier.network


def cut_network(context: TrialContext, sandbox: Sandbox, settings: TaskVerifier) -> bool:
    """The verifier's network set (`verifier_network`): cut, kept, or, for its own allowlist,
    only `hemra-gateway` (no route out but the egress proxy). True for an allowlist the proxy
    serves; a sandbox without HEMRA's network (a pool's engine) has its network cut instead,
    the stricter reading (none of the hosts rather than more)."""
    network = verifier_network(context, settings)
    if network == "allowlist" and sandbox.only_gateway_network():
        return True
    if network != "bridge":
        sandbox.disconnect_network()
    return False


@contextmanager
def verifier_egress(
    context: TrialContext, settings: TaskVerifier, folder: Path, proxied: bool
) -> Iterator[dict[str, str]]:
    """A verifier with its own allowlist: the proxy's variables for test.sh, its pass ended
    after it (what it reached and was refused kept in `folder/egress.json`); else nothing."""
    gateway = context.gateway
    if gateway is None or not proxied:
        yield {}
        return
    grant = gateway.egress.open(context.trial_id, tuple(settings.allowed_hosts or ()))
    try:
        yield proxy_env(gateway.egress.proxy_url(grant, context.gateway_host), context.direct_hosts)
    finally:
        gateway.egress.close(grant)
        grant.write(folder / "egress.json")


def is_separate(context: TrialContext) -> bool:
    """Whether the verifier gets a fresh sandbox: the run's setting or the task's, the stricter."""
    modes = {context.spec.verifier.environment_mode, context.task.config.verifier.environment_mode}
    modes |= {step.verifier.environment_mode for step in context.task.config.steps}
    return "separate" in modes


@contextmanager
def verifier_room(
    context: TrialContext, sandbox: Sandbox, request: SandboxRequest
) -> Iterator[Sandbox]:
    """Where the verifier runs. Shared (Harbor's default): the agent's sandbox as the agent
    left it, once emptied. Separate: a fresh sandbox from the same image with only the
    agent's /app copied in, so nothing the agent changed elsewhere (a replaced `python3`, a
    planted `.pth`, a process) reaches the verifier; closed when the context exits."""
    if not is_separate(context):
        yield sandbox
        return
    own = verifier_task(context.task)
    if own is not None:  # its [verifier.environment]: its image (built at resolve), its limits
        limits = task_limits(context.spec.sandbox, own)
        request = replace(
            request,
            image=context.provider.prepare(own, context.spec.sandbox.image),
            limits=replace(
                request.limits, cpus=limits.cpus, memory_mb=limits.memory_mb, pids=limits.pids
            ),
        )
    room_request = replace(
        request,
        network=request.network
        and (
            verifier_network(context, context.task.config.verifier) != "none"
            or context.spec.verifier.model_access  # the gateway's network, for its model
        ),
        name=f"{request.name}-verifier" if request.name else None,
        labels={**request.labels, "hemra.verifier": "separate"},
        mounts=(),
    )
    with context.provider.open(room_request) as room:
        _copy_into(context, sandbox, room)
        yield room


def _copy_into(context: TrialContext, sandbox: Sandbox, room: Sandbox) -> None:
    """The agent's /app, then /logs/artifacts and the task's declared `artifacts`, each at its
    own path, owners and modes kept; MAX_ROOM_COPY_BYTES in all (past it, what arrived)."""
    budget = MAX_ROOM_COPY_BYTES
    paths = [context.workdir, "/logs/artifacts", *context.task.config.artifact_paths]
    declared = context.task.config.artifact_paths
    if declared:  # their folders, made as root in the room
        parents = sorted({str(PurePosixPath(path).parent) for path in declared})
        run_root(room, 'mkdir -p "$@"', context.trial_dir / "verifier" / "room.txt", parents)
    for path in dict.fromkeys(paths):
        copy = CappedStream(sandbox.export_tree(path), budget)
        chunks = iter(copy)
        first = next(chunks, None)
        if first is None:  # not there (an artifact the agent did not make)
            continue
        try:
            room.import_tree(itertools.chain([first], chunks), str(PurePosixPath(path).parent))
        except Exception:
            if not copy.is_cut:  # a cut archive ends in an error: what arrived is verified
                raise
        budget -= copy.size
        if copy.is_cut:
            with (context.trial_dir / "verifier" / "room.txt").open("a") as note:
                note.write(
                    f"the agent's files are over {MAX_ROOM_COPY_BYTES} bytes: the verifier's"
                    f" room holds {path}'s first entries only, and nothing after it\n"
                )
            return


class CappedStream:
    """A byte stream that ends after `limit` bytes (`is_cut` then says so): the agent's /app,
    which a sparse file can make any size, never costs the runner more than that to copy."""

    def __init__(self, chunks: Iterator[bytes], limit: int) -> None:
        self._chunks, self._limit = chunks, limit
        self.is_cut = False
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.size += len(chunk)
            if self.size > self._limit:
                self.is_cut = True
                close = getattr(self._chunks, "close", None)
                if close is not None:
                    close()
                return
            yield chunk


def _run_test_sh(
    context: TrialContext,
    sandbox: Sandbox,
    tests: list[Path],
    folder: Path,
    task_settings: TaskVerifier,
) -> dict[str, bytes]:
    """The clean room, in this order: the agent's processes gone (the turn's `empty_room`; a
    separate room starts so), the verifier's network set, the tests in (root's, unreadable to
    others) under a name no one knows, then as root one command: /tests (whatever the agent
    left there) replaced by them, /logs/verifier made new, test.sh (ENTER_TESTS); the sandbox
    then halted (killed whole by the kernel) and what test.sh wrote to /logs/verifier returned
    (and kept in `folder`), read through the engine or its storage."""
    settings = context.spec.verifier
    proxied = cut_network(context, sandbox, task_settings)
    staging = f"/.hemra-tests-{secrets.token_hex(12)}"
    archive = _tests_archive(tests, staging)
    if sandbox.halted:  # left halted after the turn (`empty_room`): the tests in, then started
        placed = sandbox.put_offline(archive)
        sandbox.empty()
        if not placed:
            sandbox.import_tree(iter([archive]), "/")
    else:
        sandbox.import_tree(iter([archive]), "/")
    if is_separate(context):  # a declared artifact copied in there
        refuse_planted(sandbox.read_tree(VERIFIER_LOGS))
    identity = verifier_identity(context.task, task_settings.user, sandbox, folder / "user.txt")
    argv = ["/bin/sh", "-c", ENTER_TESTS, "sh", staging]
    if not identity.is_root:  # the room made as root first, then test.sh as its user
        log = folder / "hand-over.txt"
        run_root(sandbox, HAND_OVER, log, [staging, identity.user], VerifierError)
        log.unlink(missing_ok=True)
        argv = ["bash", f"{TESTS_DIR}/test.sh"]
    (folder / "user.txt").write_text(identity.describe() + "\n")
    with (
        verifier_egress(context, task_settings, folder, proxied) as proxy,
        verifier_model(
            context,
            sandbox,
            folder,
            provider_keys(context),
            public=verifier_network(context, task_settings) == "bridge",
        ) as model,
    ):
        result = sandbox.exec(
            argv,
            user=identity.user,
            env={
                "HOME": identity.home,
                **{name: runner_env(name) for name in settings.env},
                **_room_env(context),
                **context.render(task_settings.env),
                **proxy,
                **model,
            },
            timeout=task_settings.timeout_sec,
            stdout=folder / "stdout.txt",
            stderr=folder / "stderr.txt",
            workdir=context.workdir,
        )
    sandbox.halt()  # nothing test.sh left (an agent's program it ran) writes after it
    logs = sandbox.read_tree(VERIFIER_LOGS)
    for name, content in logs.items():
        if "/" not in name:
            (folder / name).write_bytes(content)
    if result.timed_out:
        raise VerifierError(f"verifier ran past its {task_settings.timeout_sec:g}s timeout")
    return logs


def _room_env(context: TrialContext) -> dict[str, str]:
    """The environment's variables the verifier sees: its own `[verifier.environment] env` in
    a room of its own, else the task's `[environment] env`."""
    own = verifier_task(context.task) if is_separate(context) else None
    if own is None:
        return context.task_env()
    return context.render(own.config.environment.env)


def run_root(
    sandbox: Sandbox,
    script: str,
    log: Path,
    args: Sequence[str] = (),
    failure: type[HemraError] = InfraError,
) -> str:
    """`script` run by /bin/sh as root within CLEAR_SECS, its output kept in `log` and
    returned; one that fails or runs past it raises `failure`, naming the output's end."""
    result = sandbox.exec(
        ["/bin/sh", "-c", script, "sh", *args],
        user=ROOT_USER,
        env={"HOME": "/root"},
        timeout=CLEAR_SECS,
        stdout=log,
        stderr=log,
        workdir="/",
    )
    said = log.read_text(errors="replace") if log.is_file() else ""
    if result.timed_out or result.exit_code != 0:
        raise failure(f"sandbox: clearing the verifier's room failed ({said.strip()[-300:]})")
    return said


def _tests_archive(folders: list[Path], staging: str) -> bytes:
    """The tests as one tar for /, later folders over earlier ones, in `staging`/tests: both
    mode 0700 and everything in them root's, so no other user can even list them."""
    buffer = io.BytesIO()
    tests = f"{staging.strip('/')}{TESTS_DIR}"
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in (staging.strip("/"), tests):
            top = tarfile.TarInfo(name)
            top.type, top.mode, top.mtime = tarfile.DIRTYPE, 0o700, int(time.time())
            archive.addfile(top)
        for folder in folders:
            for entry in sorted(folder.rglob("*")):
                info = archive.gettarinfo(
                    entry, arcname=f"{tests}/{entry.relative_to(folder).as_posix()}"
                )
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode = (info.mode | 0o400) & 0o755
                if info.isfile():
                    with entry.open("rb") as handle:
                        archive.addfile(info, handle)
                else:
                    archive.addfile(info)
    return buffer.getvalue()


def verify_swe(
    context: TrialContext,
    sandbox: Sandbox,
    progress: Progress,
    before: Mapping[str, bytes],
    after: Mapping[str, bytes],
) -> tuple[float, dict[str, float]]:
    """The SWE track: hidden tests on top of the agent's changes, passed / total, read from
    HEMRA's report file; `before` and `after` are /app around the agent's turn (swe.py)."""
    hemra = context.task.config.hemra
    folder = context.trial_dir
    if verifier_network(context, context.task.config.verifier) != "bridge":
        sandbox.disconnect_network()  # no proxy here: an allowlist reaches none of its hosts
    result = swe.score(
        sandbox,
        context.task.path,
        hemra.test_patch or "",
        hemra.test_command or [],
        hemra.test_timeout_sec,
        agent_diff=(folder / "diff.patch").read_text(errors="replace"),
        agent_output=text_of(folder / "agent" / "stdout.txt"),
        agent_timed_out=progress.timed_out,
        logs=folder / "verifier",
        before=before,
        after=after,
    )
    progress.swe_class = result.swe_class
    (folder / "verifier" / "swe.txt").write_text(f"{result.swe_class}: {result.detail}\n")
    if result.swe_class == SweClass.TAMPERED:  # the trial's outcome: tampered, reward 0
        raise Tampered(result.detail, evidence=result.evidence)
    rewards = {"reward": result.reward}
    if result.counts is not None:
        rewards |= {"tests_passed": result.counts.passed, "tests_total": result.counts.total}
    return result.reward, rewards


def verify_open(
    context: TrialContext, sandbox: Sandbox, progress: Progress, files: dict[str, bytes]
) -> tuple[float, dict[str, float]]:
    """The open-ended track: structural checks, then the frozen rubric prompt (openended.py)."""
    hemra, task = context.task.config.hemra, context.task
    folder = context.trial_dir
    if verifier_network(context, context.task.config.verifier) != "bridge":
        sandbox.disconnect_network()  # no proxy here: an allowlist reaches none of its hosts
    structure = openended.check_structure(sandbox, hemra, files, folder / "verifier")
    shown = {
        name: files[name.lstrip("/")][: openended.MAX_FILE_BYTES].decode(errors="replace")
        for name in hemra.expected_files
        if name.lstrip("/") in files
    }
    prompt = openended.judge_prompt(
        task.instruction, hemra.criteria, text_of(folder / "diff.patch"), shown
    )
    progress.pass_threshold = hemra.pass_threshold
    started = time.monotonic()
    text, usage = "", TrialUsage()
    error: str | None = "no gateway in this session"
    if context.gateway is not None:
        text, error, usage = ask_model(
            context.gateway,
            JudgeCall(
                context.trial_id,
                context.run_id,
                hemra.judge_model or context.spec.model or "",
                prompt,
                role=f"judge:{openended.JUDGE_NAME}",
                calls_dir=folder / "judges" / openended.JUDGE_NAME,
                scripted_reply=openended.scripted_reply(task.path, hemra.criteria),
            ),
            provider_keys(context),
            context.spec.model,
        )
    score: float | None = None
    rewards: dict[str, float] = {"structure_ok": float(structure.ok)}
    if error is None:
        try:
            verdict = openended.parse_verdict(text, hemra.criteria)
        except ValueError as failure:
            error = str(failure)
        else:
            score = openended.composite(verdict, hemra.criteria, structure)
            rewards |= {f"criterion:{name}": value for name, value in verdict.scores.items()}
    (folder / "verifier" / "open.txt").write_text(
        f"{openended.PROMPT_VERSION}: {structure.describe()}; "
        + (f"composite {score:.4f}\n" if score is not None else f"judge error: {error}\n")
    )
    judgment = Judgment(openended.JUDGE_NAME, score, text.strip(), error)
    progress.judgments.append(
        replace(with_usage(judgment, usage), duration=round(time.monotonic() - started, 4))
    )
    reward = score if score is not None else 0.0  # a judge error scores 0 (and is flagged)
    return reward, {"reward": reward, **rewards}


def provider_keys(context: TrialContext) -> dict[str, str]:
    """Real keys by provider, read from the runner's environment (kept in memory only)."""
    gateway = context.gateway
    if gateway is None:
        return {}
    keys = {
        name: os.environ[provider.key_env]
        for name, provider in gateway.providers.items()
        if provider.key_env and provider.key_env in os.environ
    }
    harness = context.harness.spec
    if harness.provider and harness.key_env and harness.key_env in os.environ:
        keys[harness.provider] = os.environ[harness.key_env]
    return keys


def text_of(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def runner_env(name: str) -> str:
    return os.environ.get(name, "")
