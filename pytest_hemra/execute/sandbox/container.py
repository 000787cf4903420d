"""One running docker sandbox: commands run in it with deadlines, its network cut and given
back, the engine's diff of it, and the whole of it killed by the kernel and started again
(`empty`). Files in and out (`files.py`), its tree read (`trees.py`) and its processes seen and
ended (`processes.py`) are the parts it is made of."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from pytest_hemra.core.errors import Tampered, VerifierError
from pytest_hemra.execute.output import DEFAULT_OUTPUT_CAP, CappedOutput
from pytest_hemra.execute.sandbox import (
    MAX_CHANGES_BYTES,
    WORKDIR,
    Change,
    ExecResult,
    storage,
)
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS
from pytest_hemra.execute.sandbox.files import KILL_GRACE_SECS, DockerInteractive, FileTransfer
from pytest_hemra.execute.sandbox.overlay import (
    overlay_changes,
    overlay_put,
    overlay_put_mounted,
    overlay_readable,
)
from pytest_hemra.execute.sandbox.processes import ProcessSweep
from pytest_hemra.execute.sandbox.trees import TreeReads

PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
STOP_SECS = 30.0  # a killed sandbox gone: its processes can take a while on a loaded machine
CHANGE_KINDS = {0: "modified", 1: "added", 2: "deleted"}  # the engine's diff Kind
# one entry of the engine's diff, its keys in either order: Kind, then the JSON string of its Path
CHANGE_ENTRY = re.compile(
    r'\{"Kind":(\d),"Path":("(?:[^"\\]|\\.)*")\}|\{"Path":("(?:[^"\\]|\\.)*"),"Kind":(\d)\}'
)


class DockerSandbox(FileTransfer, TreeReads, ProcessSweep):
    def __init__(
        self,
        client: docker.DockerClient,
        container: Any,
        *,
        runs_services: bool = False,
        kept: tuple[str, ...] = (),
        gateway_network: str | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        entrypoint: tuple[str, ...] = (),
        networks: dict[str, str] | None = None,
        guarded_init: bool = False,
    ) -> None:
        self.output_cap = output_cap  # each file an exec's output goes to: bytes kept at most
        # without: PID 1 is the keeper or `sleep infinity` (the image has no ENTRYPOINT), and
        # every other process in it is one HEMRA exec'd, or a child of one
        self.runs_services = runs_services
        self.client = client
        self.container = container
        self.api = client.api
        self._taken: list[tuple[str, str]] = []  # (name, id) disconnected for a verifier
        self._kept = kept  # networks a verifier keeps: its task's services, no way out
        self._gateway_network = gateway_network  # HEMRA's, with no way out (None: a pool's)
        self._joined: list[str] = []  # networks joined for a verifier (its allowlist)
        self._halted = False  # killed and left stopped (`halt`): read through the engine alone
        self._restarted = False  # started again by `empty`: a PID 1 that then exits is the agent's
        self._entrypoint = entrypoint  # the image's ENTRYPOINT, run again by `empty`
        self._guarded_init = guarded_init  # PID 1 is the keeper (`keeper.py`): untraceable
        # PID 1's on the engine's host (`listening_ports`): as the engine's read of the started
        # container gave it, when it did (`Containers.open` reads it once it has started)
        self._pid: int | None = int(container.attrs.get("State", {}).get("Pid") or 0) or None
        self._cut = False  # off every network but its services' (`disconnect_network`)
        # its networks but its services', name: id (as created, when read before it started)
        self._on: dict[str, str] | None = dict(networks) if networks is not None else None

    @property
    def halted(self) -> bool:
        return self._halted

    def put_local(self, archive: bytes) -> bool:
        """Unpack `archive` (HEMRA's own, owners kept) into the container's storage on this
        host, no engine round trip: halted, into its upper folder, where it appears when it
        starts again (overlay2 allows changes to its upper folder while unmounted); running,
        through its root as the engine mounted it here, for a sandbox in which nothing but
        HEMRA's runs (its agent's processes ended: the caller's word). False where that cannot
        be done (services running in it, another machine's engine, owners remapped)."""
        if self.runs_services or not storage.writes_storage(self.client):
            return False
        if self._halted:
            return overlay_put(self.container.attrs, True, archive)
        return overlay_put_mounted(self.container.attrs, archive)

    @property
    def reads_storage(self) -> bool:
        if self.runs_services:  # its services may change what is read as it is read
            return False
        return overlay_readable(self.container.attrs, storage.has_native_diff(self.client))

    @property
    def image_user(self) -> str:
        """The task image's USER (the sandbox layer keeps it as a label), "" for none (root)."""
        labels = self.container.attrs.get("Config", {}).get("Labels") or {}
        return str(labels.get("hemra.image-user") or "")

    @property
    def image_path(self) -> str:
        """PATH in the container's environment (the image's ENV, as the engine holds it)."""
        for entry in self.container.attrs.get("Config", {}).get("Env") or ():
            name, _, value = str(entry).partition("=")
            if name == "PATH":
                return value
        return ""

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
        exit_status: bool = True,
    ) -> ExecResult:
        """Run argv to completion or until `timeout`, streaming its output to files; its exit
        code asked of the engine unless not wanted (`exit_status`)."""
        started = time.monotonic()
        exec_id = self._exec_create(
            argv,
            stdout=True,
            stderr=True,
            stdin=False,
            user=user,
            environment=dict(env),
            workdir=workdir,
        )
        stream = self.api.exec_start(exec_id, stream=True, demux=True)
        failure: list[BaseException] = []

        def pump() -> None:
            try:  # each file up to the cap, its head and tail (`execute/output.py`)
                with contextlib.ExitStack() as files:
                    out = files.enter_context(CappedOutput(stdout, self.output_cap))
                    err = out
                    if stderr.absolute() != stdout.absolute():
                        err = files.enter_context(CappedOutput(stderr, self.output_cap))
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
            try:
                self._kill_processes(user)
            except DOCKER_ERRORS:  # no command runs in it any more (pids exhausted): all of it
                self.halt()
            reader.join(KILL_GRACE_SECS)
        if failure and not timed_out:
            raise failure[0]
        exit_code = None
        if exit_status and not timed_out:
            exit_code = self.api.exec_inspect(exec_id).get("ExitCode")
        return ExecResult(
            exit_code=exit_code,
            timed_out=timed_out,
            duration=time.monotonic() - started,
        )

    def start_interactive(
        self, argv: Sequence[str], *, user: str, env: Mapping[str, str], workdir: str = WORKDIR
    ) -> DockerInteractive:
        """Start argv with its stdin open, for a protocol spoken over stdio (ACP)."""
        exec_id = self._exec_create(
            argv,
            stdin=True,
            stdout=True,
            stderr=True,
            user=user,
            environment=dict(env),
            workdir=workdir,
        )
        return DockerInteractive(self.api.exec_start(exec_id, socket=True))

    def _exec_create(self, argv: Sequence[str], **options: Any) -> str:
        """A command made ready to start; in a sandbox whose PID 1 exited after `empty` started
        it again (a root agent removed or replaced what it runs), VerifierError: the agent's."""
        if self._halted:
            raise RuntimeError("sandbox: a command asked of a halted sandbox (call empty first)")
        try:
            return str(self.api.exec_create(self.container.id, list(argv), **options)["Id"])
        except docker.errors.APIError as error:
            if self._restarted and error.status_code == 409:
                raise VerifierError(
                    f"sandbox: stopped after it was emptied and started again ({error.explanation})"
                ) from error
            raise

    def halt(self) -> None:
        """SIGKILL to PID 1 (the kernel kills its whole PID namespace: every process, whatever
        its name, thread state, user or session), in one request: the engine answers a SIGKILL
        once the container has stopped (Docker's kill waits for it), so no wait is asked."""
        if self._halted:
            return
        self._pid = None
        url = self.api._url("/containers/{0}/kill", self.container.id)
        try:
            answer = self.api._post(url, params={"signal": "SIGKILL"}, timeout=STOP_SECS)
            self.api._raise_for_status(answer)
        except docker.errors.APIError as error:
            if error.status_code != 409:  # 409: not running (its PID 1 exited, or killed)
                raise
        except requests.exceptions.ReadTimeout as error:
            self.client.ping()  # an engine that does not answer: its outage, raised as such
            raise VerifierError(
                f"sandbox: still running {STOP_SECS:g}s after it was killed (a process the"
                " agent left stuck in the kernel)"
            ) from error
        self._halted = True

    def empty(self) -> None:
        """`halt`, then started again: a fresh PID 1 (the keeper or docker-init, reaping), the
        entrypoint run again. A sandbox that does not start again, or whose PID 1 exits at once, was
        broken by what the agent changed (the engine answering): VerifierError."""
        self.halt()
        if self.runs_services and self._entrypoint:
            self._check_entrypoint()
        try:
            self.container.start()
        except docker.errors.APIError as error:
            self.client.ping()
            raise VerifierError(
                f"sandbox: did not start again after it was emptied ({error.explanation})"
            ) from error
        self._halted = False
        self._restarted = True

    def _check_entrypoint(self) -> None:
        """Before the image's entrypoint runs again (as root, beside the verifier): Tampered when
        the engine's diff says the agent changed what it runs (a path it names, or the program
        it names found on PATH); a diff too large to read is not checked, and says so."""
        try:
            changed = [change.path for change in self.changes()]
        except OverflowError as error:
            raise Tampered(
                "the sandbox's changes could not be checked before its entrypoint ran again",
                evidence=(f"/: {error}, not checked",),
            ) from error
        first = self._entrypoint[0]
        named = {arg for arg in self._entrypoint if arg.startswith("/")}
        if "/" not in first:
            named |= {f"{folder}/{first}" for folder in PATH}
        found = [path for path in changed if path in named]
        if found:
            raise Tampered(
                "the agent changed the image's entrypoint, which runs again when its sandbox is"
                " emptied",
                evidence=tuple(f"{path}: the image's ENTRYPOINT, run as root" for path in found),
            )

    def changes(self) -> list[Change]:
        """The engine's diff of the container against its image (Kind 0, 1, 2): read from its
        overlay2 folders on this host when the engine is local (`overlay.py`: the same answer,
        a thousand times faster), else asked of the engine, its answer read up to
        `MAX_CHANGES_BYTES` (past it, OverflowError) and parsed entry by entry."""
        found = overlay_changes(self.container.attrs, storage.has_native_diff(self.client))
        if found is not None:
            return found
        response = self.api._get(
            self.api._url("/containers/{0}/changes", self.container.id), stream=True
        )
        try:
            self.api._raise_for_status(response)
            body = response.raw.read(MAX_CHANGES_BYTES + 1, decode_content=True)
        finally:
            response.close()
        if len(body) > MAX_CHANGES_BYTES:
            raise OverflowError(f"the engine's diff is over {MAX_CHANGES_BYTES >> 20} MiB")
        text = body.decode(errors="replace")
        entries = [
            (json.loads(entry[1] or entry[2]), int(entry[0] or entry[3]))
            for entry in CHANGE_ENTRY.findall(text)
        ]
        if len(entries) != text.count('"Path":'):  # not the compact form: the slower parse
            entries = [(str(e["Path"]), int(e["Kind"])) for e in json.loads(text) or ()]
        return [Change(path, CHANGE_KINDS.get(kind, "modified")) for path, kind in entries]

    def _networks(self) -> dict[str, str]:
        """The networks it is on but its services', by name, each with the id it is on (a
        network of the same name made since is not it): as the engine's read of it once
        started gave them, then as HEMRA changed them (nothing in the sandbox can join one)."""
        if self._on is None:
            if "NetworkSettings" not in self.container.attrs:  # never read (not HEMRA's open)
                self.container.reload()
            found = self.container.attrs["NetworkSettings"].get("Networks") or {}
            self._on = {
                name: network.get("NetworkID") or name
                for name, network in found.items()
                if name != "none" and name not in self._kept
            }
        return self._on

    def disconnect_network(self) -> None:
        """Off every network but its services'. Once cut, it stays so until
        `reconnect_network` (nothing in the sandbox can join one)."""
        if self._cut:
            return
        on = self._networks()
        for name, found in list(on.items()):
            self.api.disconnect_container_from_network(self.container.id, found, force=True)
            self._taken.append((name, found))
            del on[name]
        self._cut = True

    def only_gateway_network(self) -> bool:
        """Off every network but HEMRA's `hemra-gateway`, which has no route out (the gateway's
        and its egress proxy's ports on its host address are all it reaches): a verifier with
        its own allowlist. False where the sandbox has no such network (a pool's engine)."""
        gateway = self._gateway_network
        if gateway is None:
            return False
        if set(self._networks()) == {gateway}:
            return True
        self.disconnect_network()
        self.api.connect_container_to_network(self.container.id, gateway)
        self._joined.append(gateway)
        self._networks()[gateway] = gateway
        self._cut = False  # on a network again: a later cut takes it off
        return True

    def reconnect_network(self) -> None:
        self._cut = False
        on = self._networks()
        while self._joined:
            network = self._joined.pop()
            self.api.disconnect_container_from_network(self.container.id, network, force=True)
            on.pop(network, None)
        while self._taken:
            name, found = self._taken.pop()
            self.api.connect_container_to_network(self.container.id, found)
            on[name] = found
