"""A docker engine's images: each task's built (or found cached) by content digest with HEMRA's
sandbox layer on top, and a multi-container task's service images beside it, nothing pulled;
what a Dockerfile builds FROM and what a failed build last said; an image copied from the
runner's engine to another one (`docker save` streamed into `docker load`); and a lock per engine
and image on the runner, so runners preparing the same image at once do the work once.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import docker
import docker.errors

from pytest_hemra.core.errors import InfraError
from pytest_hemra.core.filelock import file_lock
from pytest_hemra.execute.sandbox import AGENT_HOME, AGENT_USER, WORKDIR, buildkit
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS, EngineClient, on_this_machine
from pytest_hemra.resolve.compose import Build, Compose
from pytest_hemra.resolve.datasets import Task, tree_digest

SANDBOX_LAYER_VERSION = "2"  # 2: the image's USER kept as a label
TASK_REPOSITORY = "hemra-task"
SANDBOX_REPOSITORY = "hemra-sandbox"
COPY_TIMEOUT_SECS = 900.0  # the longest a runner waits for another copying the same image
SERVICE_REPOSITORY = "hemra-service"
LOCK_POLL_SECS = 0.1
SANDBOX_LAYER = f"""\
FROM {{image}}
USER root
RUN mkdir -p {WORKDIR} /logs/agent /logs/verifier {AGENT_HOME} /hemra \\
 && chown -R {AGENT_USER} {WORKDIR} /logs/agent {AGENT_HOME} \\
 && chmod 0755 /logs /logs/verifier /hemra
WORKDIR {WORKDIR}
LABEL hemra.sandbox-layer="{SANDBOX_LAYER_VERSION}" hemra.image-user="{{user}}"
"""
IMAGE_USER = re.compile(r"[A-Za-z0-9_.-]*(:[A-Za-z0-9_.-]+)?")  # "" (root), name, uid:gid
TAIL_LINES = 3
TAIL_LINE_CHARS = 200
COLOURS = re.compile(r"\x1b\[[0-9;]*m")
# the classic builder's own bookkeeping between a build's steps, which says nothing of a failure
BOOKKEEPING = re.compile(r"^(---> |Removing intermediate container )")


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile builds FROM, in order and once each; earlier stages, `scratch`
    and references with an unexpanded ARG are left out."""
    stages: set[str] = set()
    found: list[str] = []
    for line in re.sub(r"\\\r?\n", " ", dockerfile).splitlines():
        words = line.split()
        if not words or words[0].upper() != "FROM":
            continue
        args = [word for word in words[1:] if not word.startswith("--")]
        if not args:
            continue
        image = args[0]
        if image.lower() not in stages and image != "scratch" and "$" not in image:
            found.append(image)
        if len(args) >= 3 and args[1].upper() == "AS":
            stages.add(args[2].lower())
    return list(dict.fromkeys(found))


def build_tail(log: Iterable[Mapping[str, Any]]) -> str:
    """The last lines a failed build printed (its steps and their output, Docker's bookkeeping
    and colours left out), joined by ` | `: what says why it failed, for a one-line error."""
    text = COLOURS.sub("", "".join(str(entry.get("stream") or "") for entry in log))
    lines = [line.strip() for line in text.splitlines()]
    kept = [line[:TAIL_LINE_CHARS] for line in lines if line and not BOOKKEEPING.match(line)]
    return " | ".join(kept[-TAIL_LINES:])


def copy_image(source: Any, target: Any, reference: str) -> None:
    """Copy `reference` (with its tag) from the `source` engine to the `target` engine, streamed:
    what `docker save REF | docker -H TARGET load` does, without holding the image in memory."""
    try:
        stream = source.api.get_image(reference)
        for message in target.api.load_image(stream):
            if isinstance(message, dict) and message.get("error"):
                raise InfraError(f"docker load of {reference} failed: {message['error']}")
    except InfraError:
        raise
    except Exception as error:  # the docker SDK and requests raise many kinds
        raise InfraError(f"copying image {reference} to the engine failed ({error})") from error


class LockHolder(Protocol):
    """Where a process holds the engine's locks when not in its machine's lock files: a shared
    store's (`Store.lock`), for runners on several machines using one engine."""

    def __call__(
        self, name: str, timeout: float, waited: str, *, shared: bool = False
    ) -> AbstractContextManager[None]: ...


_held_in: LockHolder | None = None


def hold_engine_locks_in(holder: LockHolder | None) -> None:
    """Hold this process's engine locks in `holder` (a shared store's), or, with None, in its
    machine's lock files again."""
    global _held_in
    _held_in = holder


@contextmanager
def engine_lock(
    engine: str, what: str, timeout: float, *, shared: bool = False, key: str | None = None
) -> Iterator[None]:
    """Hold the lock on (`engine`, `what`) for up to `timeout` seconds of waiting; `shared`:
    with every other shared holder (its users), only never with an exclusive one (the one that
    removes what they use). Held in the runner host's lock files (each call opens the lock's
    file anew, so the threads of one process exclude each other as other processes do), or in
    the shared store when the process holds them there (`hold_engine_locks_in`) and the engine
    is not this machine's own (a Unix socket): only this machine's processes reach that one,
    whatever store each uses, so its locks stay in this machine's lock files. `key` names the
    engine in the lock when its address does not alone (`EngineClient.lock_key`)."""
    name = hashlib.sha256(f"{key or engine}\0{what}".encode()).hexdigest()[:32]
    waited = f"engine {engine}: waited {timeout:g}s for another runner preparing {what}"
    if _held_in is not None and not on_this_machine(engine):
        with _held_in(f"hemra-engine-lock {name}", timeout, waited, shared=shared):
            yield
        return
    folder = Path(tempfile.gettempdir()) / "hemra-locks"
    folder.mkdir(mode=0o700, exist_ok=True)
    with file_lock(folder / f"{name}.lock", timeout, waited, shared=shared, poll=LOCK_POLL_SECS):
        yield


class Images:
    """The images of one engine (`engine`); `image_source` gives the runner's engine, from which
    images missing here are copied (a pool's engines start with none)."""

    def __init__(
        self,
        engine: EngineClient,
        image_source: Callable[[], docker.DockerClient | None] | None = None,
    ) -> None:
        self.engine = engine
        self._image_source = image_source
        self._builder: buildkit.Engine | None = None  # what builds here, asked once
        # images seen here, by reference: asked of the engine once a process (HEMRA's tags
        # name their content); one not found is asked again, one gone since is `forget`-ten
        self._known: dict[str, dict[str, Any]] = {}

    @property
    def client(self) -> docker.DockerClient:
        return self.engine.client

    def prepare(self, task: Task, default_image: str) -> str:
        """The task image with HEMRA's sandbox layer on top, built once per content digest."""
        try:
            base = self._task_image(task, default_image)
            layer_tag = (
                f"{SANDBOX_REPOSITORY}:"
                + hashlib.sha256(f"{base}\0{SANDBOX_LAYER_VERSION}".encode()).hexdigest()[:24]
            )
            if not self._has_image(layer_tag):
                with self._lock(layer_tag, task.config.environment.build_timeout_sec):
                    if not self._has_image(layer_tag):
                        user = self._inspected(base)["Config"].get("User") or ""
                        if not IMAGE_USER.fullmatch(user):  # it goes into a LABEL line as is
                            raise InfraError(
                                f"{task.path}: image {base}: USER {user!r} is not a user name"
                                " or uid (name, uid, name:group, uid:gid)"
                            )
                        dockerfile = SANDBOX_LAYER.format(image=base, user=user).encode()
                        self._build(task, tag=layer_tag, fileobj=io.BytesIO(dockerfile))
            self._prepare_services(task)  # a multi-container task's, no layer on them
            return layer_tag
        except DOCKER_ERRORS as error:
            raise InfraError(f"{task.path}: docker failed preparing the image ({error})") from error

    def missing_images(self, task: Task, default_image: str) -> list[str]:
        """What `prepare` would have to build (or find missing) for a task, building nothing."""
        found = self._missing_services(task)
        if not task.has_dockerfile:
            image = task.config.environment.docker_image or default_image
            return found if self._has_image(image) else [f"{image} (not on this engine)", *found]
        tag = f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"
        return found if self._has_image(tag) else [f"{tag} (from {task.environment_dir})", *found]

    def _task_image(self, task: Task, default_image: str) -> str:
        named = task.config.environment.docker_image
        if not task.has_dockerfile:
            image = named or default_image
            self._copy_if_missing(image)
            if not self._has_image(image):
                raise InfraError(f"{task.path}: image {image!r} is not on this docker engine")
            return str(self._inspected(image)["Id"])
        tag = f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"
        if not self._has_image(tag):  # a pool's engine: built at resolve on the runner's, copied
            self._copy_if_missing(tag)
        if not self._has_image(tag):
            with self._lock(tag, task.config.environment.build_timeout_sec):
                if not self._has_image(tag):
                    dockerfile = (task.environment_dir / "Dockerfile").read_text(errors="replace")
                    for base in base_images(dockerfile):
                        self._copy_if_missing(base)
                    self.build_dockerfile(task, tag=tag, context=task.environment_dir)
        return str(self._inspected(tag)["Id"])

    def _copy_if_missing(self, reference: str) -> None:
        """An image missing on this engine but on the runner's is copied over (save | load)."""
        if self._image_source is None or self._has_image(reference):
            return
        source = self._image_source()
        if source is None:
            return
        with self._lock(reference, COPY_TIMEOUT_SECS):
            if self._has_image(reference):
                return
            try:
                source.images.get(reference)
            except docker.errors.ImageNotFound:
                return  # not on the runner's engine either: a build pulls it, or says so
            copy_image(source, self.client, reference)

    def _lock(self, image: str, timeout: float) -> contextlib.AbstractContextManager[None]:
        return engine_lock(self.engine.address, image, timeout, key=self.engine.lock_key)

    def has_image(self, reference: str) -> bool:
        """Whether this engine holds `reference` (False when it does not answer)."""
        try:
            return self._has_image(reference)
        except DOCKER_ERRORS:
            return False

    def task_image(self, task: Task, default_image: str) -> str:
        """The reference of a task's own image (before HEMRA's layer), as `prepare` names it."""
        if not task.has_dockerfile:
            return task.config.environment.docker_image or default_image
        return f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"

    def _has_image(self, reference: str) -> bool:
        return self.inspect(reference) is not None

    def inspect(self, reference: str) -> dict[str, Any] | None:
        """The engine's description of an image (its id, its config), None when it has none."""
        found = self._known.get(reference)
        if found is None:
            try:
                found = self.client.api.inspect_image(reference)
            except docker.errors.ImageNotFound:
                return None
            self._known[reference] = found
        return found

    def forget(self) -> None:
        """An image is gone from the engine since it was seen (a sandbox's create found none):
        every one is asked about again."""
        self._known.clear()

    def _inspected(self, reference: str) -> dict[str, Any]:
        found = self.inspect(reference)
        if found is None:
            raise docker.errors.ImageNotFound(f"No such image: {reference}")
        return found

    def build_dockerfile(
        self,
        task: Task,
        *,
        tag: str,
        context: Path,
        dockerfile: str = "Dockerfile",
        buildargs: Mapping[str, str] | None = None,
    ) -> None:
        """Build `context/dockerfile` as `tag`: by the classic builder, or by the engine's
        BuildKit when a line needs it (`buildkit.py`); a line this engine cannot build refuses
        the build in one line naming the file, the line and what would build it."""
        found = buildkit.buildkit_lines((context / dockerfile).read_text(errors="replace"))
        options: dict[str, Any] = {} if dockerfile == "Dockerfile" else {"dockerfile": dockerfile}
        if buildargs is not None:
            options["buildargs"] = dict(buildargs)
        if not found:
            self._build(task, tag=tag, path=str(context), **options)
            return
        if self._builder is None:
            self._builder = buildkit.engine_builder(self.client.version())
        reason = buildkit.refusal(context / dockerfile, found, self._builder)
        if reason is not None:
            raise InfraError(reason)
        try:
            buildkit.build(
                self.client,
                context,
                tag=tag,
                dockerfile=dockerfile,
                labels={"hemra.task": task.name},
                buildargs=buildargs,
                timeout=task.config.environment.build_timeout_sec,
            )
        except InfraError as error:
            raise InfraError(f"{task.path}: {error}") from error

    def _build(self, task: Task, *, tag: str, **source: Any) -> None:
        try:
            self.client.images.build(
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                timeout=task.config.environment.build_timeout_sec,
                labels={"hemra.task": task.name},
                **source,
            )
        except docker.errors.BuildError as error:
            tail = build_tail(error.build_log)
            raise InfraError(f"{task.path}: image build failed: {error.msg} ({tail})") from error

    def _missing_services(self, task: Task) -> list[str]:
        """What `_prepare_services` would build, or find missing, building nothing."""
        compose = task.compose
        if compose is None:
            return []
        missing = []
        for name, service in sorted(compose.services.items()):
            reference = service_image(task, compose, name)
            if not self.has_image(reference):
                source = "not on this engine" if service.build is None else f"service {name}"
                missing.append(f"{reference} ({source})")
        return missing

    def _prepare_services(self, task: Task) -> None:
        """Every service image of the task built (or found cached); an `image` the engine lacks
        is an error naming the service: nothing is pulled."""
        compose = task.compose
        if compose is None:
            return
        timeout = task.config.environment.build_timeout_sec
        for name, service in sorted(compose.services.items()):
            reference = service_image(task, compose, name)
            self._copy_if_missing(reference)
            if self.has_image(reference):
                continue
            where = f"{compose.path}: service {name!r}"
            if service.build is None:
                raise InfraError(
                    f"{where}: image {reference!r} is not on this docker engine (nothing is"
                    " pulled: give the service a 'build', or load the image first)"
                )
            build = service.build
            context = (compose.path.parent / build.context).resolve()
            with self._lock(reference, timeout):
                if self.has_image(reference):
                    continue
                dockerfile = (context / build.dockerfile).read_text(errors="replace")
                for base in base_images(dockerfile):
                    self._copy_if_missing(base)
                try:
                    self.build_dockerfile(
                        task,
                        tag=reference,
                        context=context,
                        dockerfile=build.dockerfile,
                        buildargs=build.args,
                    )
                except InfraError as error:
                    told = f"{where}: {error}".replace(f"{task.path}: ", "", 1)
                    raise InfraError(told) from error


def service_image(task: Task, compose: Compose, name: str) -> str:
    """The reference a service runs: its build's tag (by content digest) or its `image`."""
    service = compose.services[name]
    if service.build is None:
        return str(service.image)
    return f"{SERVICE_REPOSITORY}:{_build_digest(compose, service.build)[:24]}"


def _build_digest(compose: Compose, build: Build) -> str:
    context = (compose.path.parent / build.context).resolve()
    digest = hashlib.sha256(tree_digest(context, [context]).encode())
    digest.update(f"\0{build.dockerfile}\0{sorted(build.args.items())}".encode())
    return digest.hexdigest()
