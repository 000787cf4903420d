"""The docker provider: task images cached by content digest, one locked-down container a trial.

Containers run `sleep infinity` as PID 1 as the agent user with every capability dropped; they
are removed with force (a `sleep` PID 1 ignores SIGTERM, and waiting out Docker's grace period
costs ~10 s a trial). Every wait has a deadline enforced here.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import os
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import requests
from docker.utils.socket import frames_iter

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import (
    AGENT_HOME,
    AGENT_USER,
    WORKDIR,
    ExecResult,
    SandboxRequest,
)
from pytest_hemra.execute.sandbox.images import base_images, copy_image, engine_lock
from pytest_hemra.resolve.datasets import Task

SANDBOX_LAYER_VERSION = "1"
TASK_REPOSITORY = "hemra-task"
SANDBOX_REPOSITORY = "hemra-sandbox"
MAX_TREE_FILE_BYTES = 1 << 20
KILL_GRACE_SECS = 5.0
DOCKER_ERRORS = (docker.errors.DockerException, requests.RequestException)
COPY_TIMEOUT_SECS = 900.0  # the longest a runner waits for another copying the same image

SANDBOX_LAYER = f"""\
FROM {{image}}
USER root
RUN mkdir -p {WORKDIR} /logs/agent /logs/verifier {AGENT_HOME} /hemra \\
 && chown -R {AGENT_USER} {WORKDIR} /logs/agent {AGENT_HOME} \\
 && chmod 0755 /logs /logs/verifier /hemra
WORKDIR {WORKDIR}
LABEL hemra.sandbox-layer="{SANDBOX_LAYER_VERSION}"
"""


def connect() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: the engine does not answer ({error})") from error
    return client


class DockerProvider:
    """One Docker engine: the runner's own (DOCKER_HOST, else the local socket) unless given a
    `client`. `image_source` gives the runner's engine, from which images missing here are
    copied (a pool's engines start with none); `engine` names this one in locks and errors."""

    name = "docker"
    capabilities = frozenset({"docker", "network_block", "cpu_limit", "memory_limit"})

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        engine: str | None = None,
        image_source: Callable[[], docker.DockerClient | None] | None = None,
    ) -> None:
        self._client = client
        self.engine = engine or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._image_source = image_source

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect()
        return self._client

    def check(self) -> None:
        _ = self.client

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
                        dockerfile = SANDBOX_LAYER.format(image=base).encode()
                        self._build(task, tag=layer_tag, fileobj=io.BytesIO(dockerfile))
            return layer_tag
        except DOCKER_ERRORS as error:
            raise InfraError(f"{task.path}: docker failed preparing the image ({error})") from error

    def missing_images(self, task: Task, default_image: str) -> list[str]:
        """What `prepare` would have to build (or find missing) for a task, building nothing."""
        if not task.has_dockerfile:
            image = task.config.environment.docker_image or default_image
            return [] if self._has_image(image) else [f"{image} (not on this engine)"]
        tag = f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"
        return [] if self._has_image(tag) else [f"{tag} (from {task.environment_dir})"]

    def _task_image(self, task: Task, default_image: str) -> str:
        named = task.config.environment.docker_image
        if not task.has_dockerfile:
            image = named or default_image
            self._copy_if_missing(image)
            if not self._has_image(image):
                raise InfraError(f"{task.path}: image {image!r} is not on this docker engine")
            return str(self.client.images.get(image).id)
        tag = f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"
        if not self._has_image(tag):
            with self._lock(tag, task.config.environment.build_timeout_sec):
                if not self._has_image(tag):
                    dockerfile = (task.environment_dir / "Dockerfile").read_text(errors="replace")
                    for base in base_images(dockerfile):
                        self._copy_if_missing(base)
                    self._build(task, tag=tag, path=str(task.environment_dir))
        return str(self.client.images.get(tag).id)

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
        return engine_lock(self.engine, image, timeout)

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
        try:
            self.client.images.get(reference)
        except docker.errors.ImageNotFound:
            return False
        return True

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
            tail = " | ".join(
                str(line.get("stream") or line.get("error") or "").strip()
                for line in list(error.build_log)[-3:]
            )
            raise InfraError(f"{task.path}: image build failed: {error.msg} ({tail})") from error

    def gateway_host(self) -> str | None:
        """The bridge network's gateway address: the host side of every sandbox's network."""
        try:
            configs = self.client.networks.get("bridge").attrs["IPAM"]["Config"] or []
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot read the bridge network ({error})") from error
        for config in configs:
            if config.get("Gateway"):
                return str(config["Gateway"])
            if config.get("Subnet") and ":" not in config["Subnet"]:
                network = ipaddress.ip_network(config["Subnet"], strict=False)
                return str(next(network.hosts()))
        return None

    def remove_sandboxes(self, labels: Mapping[str, str]) -> int:
        filters = {"label": ["hemra=1", *(f"{key}={value}" for key, value in labels.items())]}
        try:
            found = self.client.containers.list(all=True, filters=filters)
            for container in found:
                remove_container(container)
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot remove sandboxes {dict(labels)} ({error})") from error
        return len(found)

    @contextmanager
    def open(self, request: SandboxRequest) -> Iterator[DockerSandbox]:
        limits = request.limits
        options: dict[str, Any] = {
            "entrypoint": ["sleep", "infinity"],
            "command": [],
            "user": AGENT_USER,
            "working_dir": WORKDIR,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": limits.pids,
            "network_mode": "bridge" if request.network else "none",
            "labels": {"hemra": "1", **request.labels},
            "detach": True,
            "environment": {},
        }
        if limits.memory_mb:
            options["mem_limit"] = f"{limits.memory_mb}m"
            options["memswap_limit"] = f"{limits.memory_mb}m"
        if limits.cpus:
            options["nano_cpus"] = int(limits.cpus * 1e9)
        if request.name:
            options["name"] = request.name
        if request.mounts:
            options["volumes"] = {
                str(mount.source): {"bind": mount.target, "mode": "ro" if mount.read_only else "rw"}
                for mount in request.mounts
            }
        container = None
        try:
            container = self.client.containers.run(request.image, **options)
            yield DockerSandbox(self.client, container)
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: sandbox failed ({error})") from error
        finally:
            if container is not None:
                remove_container(container)


def remove_container(container: Any) -> None:
    """Remove with force; one already gone (or going: `hemra cancel` removed it) is fine."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as error:
        if error.status_code != 409:  # 409: its removal is already in progress
            raise


class DockerSandbox:
    def __init__(self, client: docker.DockerClient, container: Any) -> None:
        self.client = client
        self.container = container
        self.api = client.api
        self._taken: list[str] = []  # networks disconnected for a verifier

    def exec(
        self,
        argv: Sequence[str],
        *,
        user: str,
        env: Mapping[str, str],
        timeout: float,
        stdout: Path,
        stderr: Path,
        workdir: str = WORKDIR,
    ) -> ExecResult:
        """Run argv to completion or until `timeout`, streaming its output to files."""
        started = time.monotonic()
        exec_id = self.api.exec_create(
            self.container.id,
            list(argv),
            stdout=True,
            stderr=True,
            stdin=False,
            user=user,
            environment=dict(env),
            workdir=workdir,
        )["Id"]
        stream = self.api.exec_start(exec_id, stream=True, demux=True)
        failure: list[BaseException] = []

        def pump() -> None:
            try:
                with stdout.open("ab") as out, stderr.open("ab") as err:
                    for chunk_out, chunk_err in stream:
                        if chunk_out:
                            out.write(chunk_out)
                        if chunk_err:
                            err.write(chunk_err)
            except BaseException as error:  # surfaced to the caller below
                failure.append(error)

        reader = threading.Thread(target=pump, name="hemra-exec", daemon=True)
        reader.start()
        reader.join(timeout)
        timed_out = reader.is_alive()
        if timed_out:
            self._kill_processes(user)
            reader.join(KILL_GRACE_SECS)
        if failure and not timed_out:
            raise failure[0]
        exit_code = self.api.exec_inspect(exec_id).get("ExitCode")
        return ExecResult(
            exit_code=None if timed_out else exit_code,
            timed_out=timed_out,
            duration=time.monotonic() - started,
        )

    def start_interactive(
        self, argv: Sequence[str], *, user: str, env: Mapping[str, str], workdir: str = WORKDIR
    ) -> DockerInteractive:
        """Start argv with its stdin open, for a protocol spoken over stdio (ACP)."""
        exec_id = self.api.exec_create(
            self.container.id,
            list(argv),
            stdin=True,
            stdout=True,
            stderr=True,
            user=user,
            environment=dict(env),
            workdir=workdir,
        )["Id"]
        return DockerInteractive(self.api.exec_start(exec_id, socket=True))

    def _kill_processes(self, user: str) -> None:
        """Kill every process of `user` but PID 1: the exec's whole tree, whatever it spawned."""
        self.container.exec_run(["/bin/sh", "-c", "kill -9 -1"], user=user)

    def put_dir(self, source: Path, target: str) -> None:
        """Copy a host folder in as `target`, owned by root and read-only for the agent."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            archive.add(source, arcname=target.strip("/"), filter=_root_owned)
        self.container.put_archive("/", buffer.getvalue())

    def put_file(self, content: bytes, target: str, owner: str | None = None) -> None:
        """Write one file; with `owner` ("uid:gid") it and its new folders under the agent's
        home belong to that user, so a harness can keep writing its own config."""
        uid, gid = (int(part) for part in (owner or "0:0").split(":"))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            relative = target.strip("/")
            if owner and target.startswith(AGENT_HOME + "/"):
                parents = PurePosixPath(relative).parents
                for folder in reversed([p for p in parents if len(p.parts) > 2]):
                    info = tarfile.TarInfo(str(folder))
                    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
                    archive.addfile(info)
            info = tarfile.TarInfo(relative)
            info.size, info.mode, info.uid, info.gid = len(content), 0o644, uid, gid
            info.mtime = int(time.time())
            archive.addfile(info, io.BytesIO(content))
        self.container.put_archive("/", buffer.getvalue())

    def read_tree(self, path: str) -> dict[str, bytes]:
        """Regular files under `path` (relative names); files over 1 MiB read as empty."""
        try:
            chunks, _ = self.container.get_archive(path)
        except docker.errors.NotFound:
            return {}
        data = b"".join(chunks)
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                name = member.name.split("/", 1)[1] if "/" in member.name else member.name
                handle = archive.extractfile(member)
                if handle is not None and member.size <= MAX_TREE_FILE_BYTES:
                    files[name] = handle.read()
                else:
                    files[name] = b""
        return files

    def disconnect_network(self) -> None:
        self.container.reload()
        for network in self.container.attrs["NetworkSettings"]["Networks"]:
            if network != "none":
                self.client.networks.get(network).disconnect(self.container, force=True)
                self._taken.append(network)

    def reconnect_network(self) -> None:
        while self._taken:
            self.client.networks.get(self._taken.pop()).connect(self.container)


class DockerInteractive:
    """A process's stdin to write and its multiplexed stdout/stderr to read, frame by frame."""

    def __init__(self, sock: Any) -> None:
        self._io = sock
        self._raw = getattr(sock, "_sock", sock)

    def send(self, data: bytes) -> None:
        self._raw.sendall(data)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_WR)

    def frames(self) -> Iterator[tuple[int, bytes]]:
        """(1 for stdout or 2 for stderr, bytes) until the process closes its output."""
        for stream, data in frames_iter(self._io, tty=False):
            yield int(stream), bytes(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.close()


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = (info.mode | 0o444) & ~0o022
    if info.isdir() or info.mode & 0o100:
        info.mode |= 0o111
    return info
