"""Extra Docker engines on this machine, for the engine-pool tests and benchmark.

Each is a `dockerd` of its own: its own data root, exec root, pidfile and unix socket, with no
bridge and no iptables rules (`--bridge=none --iptables=false`: its sandboxes get network
"none"), reached at a loopback address of its own (127.0.0.2:2375, 127.0.0.3:2375, ...). It
starts with no image at all.

It runs in a network namespace of its own (`unshare --net`): a dockerd started with
`--bridge=none` deletes the host's `docker0` interface at start, which would cut every bridge
sandbox of the machine's main engine off. So its TCP address is served from this process, a
forwarder from 127.0.0.N:2375 to the engine's unix socket; when the engine dies, connections
through it fail at once, as they would to a dead engine.

`remove()` leaves nothing behind, whatever state the engine is in: a killed engine is started
again so that dockerd itself cleans up its containers, then stopped; what is still left
(processes of its containers, mounts) goes by PID and path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from pytest_hemra.execute.sandbox.images import copy_image

PORT = 2375
START_TIMEOUT_SECS = 60.0
STOP_TIMEOUT_SECS = 30.0


def require_engines(what: str) -> None:
    """Starting more engines needs root, dockerd and unshare: without them the test is
    skipped, or under CI failed (engine tests never skip there). `what` ends the message."""
    missing = [tool for tool in ("dockerd", "unshare") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        message = f"needs root and {', '.join(missing) or 'dockerd'} to start {what}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@contextlib.contextmanager
def running_engines(
    count: int, what: str, *, first: int = 2, image: tuple[Any, str] | None = None
) -> Iterator[list[ExtraEngine]]:
    """`count` more engines on this machine, started (`require_engines(what)` first), each
    given `image` (a client of the engine holding it, and its reference) when named; removed
    (processes, mounts, folders) on every path."""
    require_engines(what)
    engines = [ExtraEngine(host) for host in free_loopback_hosts(count, first)]
    try:
        for engine in engines:
            engine.start()
            if image is not None:
                source, reference = image
                client = docker.DockerClient(base_url=engine.address, timeout=120)
                copy_image(source, client, reference)
                client.close()
        yield engines
    finally:
        for engine in engines:
            engine.remove()


def free_loopback_hosts(count: int, first: int = 2) -> list[str]:
    """`count` addresses 127.0.0.N whose port 2375 nobody listens on."""
    found: list[str] = []
    for last in range(first, 250):
        host = f"127.0.0.{last}"
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, PORT))
            except OSError:
                continue
        found.append(host)
        if len(found) == count:
            return found
    raise RuntimeError(f"no {count} free loopback addresses for port {PORT}")


class UnixForwarder:
    """TCP on (host, port) forwarded to a unix socket, a thread per direction of a connection;
    with `tls`, each connection's TLS is ended here first (as `dockerd --tlsverify` would)."""

    def __init__(
        self, host: str, port: int, target: Path, tls: ssl.SSLContext | None = None
    ) -> None:
        self.target = target
        self.tls = tls
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind((host, port))
        self.server.listen(128)
        threading.Thread(target=self._accept, name="hemra-forwarder", daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.tls is not None:
                try:
                    client.settimeout(10)
                    client = self.tls.wrap_socket(client, server_side=True)
                    client.settimeout(None)
                except (OSError, ssl.SSLError):
                    client.close()  # a client without the right certificate is turned away
                    continue
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(str(self.target))
            except OSError:
                upstream.close()
                client.close()  # the engine is gone: refused, as a dead engine's port would be
                continue
            done = threading.Barrier(2, action=lambda c=client, u=upstream: (c.close(), u.close()))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(source, sink, done), name="hemra-pump", daemon=True
                ).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, done: threading.Barrier) -> None:
        try:
            while chunk := source.recv(1 << 16):
                sink.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)  # half-close: the other direction may still talk
        with contextlib.suppress(threading.BrokenBarrierError):
            done.wait()


class ExtraEngine:
    """One extra dockerd: `start()`, `kill()` (SIGKILL, as a machine lost), `stop()`, `remove()`."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.root = Path(tempfile.mkdtemp(prefix="hemra-dockerd-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.forwarder: UnixForwarder | None = None

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{PORT}"

    @property
    def socket_path(self) -> Path:
        return self.root / "docker.sock"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        argv = [
            "unshare", "--net", "--",  # its own network namespace: the host's is left alone
            "dockerd",
            "--data-root", str(self.root / "data"),
            "--exec-root", str(self.root / "exec"),
            "--pidfile", str(self.root / "dockerd.pid"),
            "-H", f"unix://{self.socket_path}",
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
            "--shutdown-timeout", "2",
        ]  # fmt: skip
        log = (self.root / "dockerd.log").open("ab")
        self.process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        if self.forwarder is None:
            self.forwarder = UnixForwarder(self.host, PORT, self.socket_path)
        deadline = time.monotonic() + START_TIMEOUT_SECS
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"dockerd on {self.address} exited:\n{self.log_tail()}")
            try:
                client = docker.DockerClient(base_url=self.address, timeout=5)
                client.ping()
                client.close()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dockerd on {self.address} did not answer in {START_TIMEOUT_SECS:g}s:\n"
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(0.2)

    def kill(self, *, whole: bool = False) -> None:
        """SIGKILL, by PID: the engine is gone at once, its sandboxes with it; `whole`, the
        processes it started too (its containers' shims and processes: a service lost whole),
        so that it starts again at once instead of restoring them. Its containerd dies with
        it, but its pidfile stays and may name a zombie (nothing here reaps orphans), which a
        dockerd started again would wait on for 15 s: the pidfile goes too."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_SECS)
            (self.root / "exec" / "containerd" / "containerd.pid").unlink(missing_ok=True)
            if whole:
                self._kill_leftovers()

    def stop(self) -> None:
        """SIGTERM: dockerd stops its containers and its containerd, then exits."""
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_SECS)

    def remove(self) -> None:
        """Stop the engine and delete everything it had, on every path."""
        if self.process is not None and self.process.poll() is not None:
            with contextlib.suppress(Exception):
                self.start()  # a killed dockerd cleans up its containers when started again
        self.stop()
        if self.forwarder is not None:
            self.forwarder.close()
            self.forwarder = None
        self._kill_leftovers()
        for mount in sorted(self._mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """Processes this engine started that outlived it: its containerd and shims (their
        command lines name its root) and its containers' processes (their cgroups name a
        container of its data root)."""
        containers = self.root / "data" / "containers"
        ids = [p.name for p in containers.iterdir()] if containers.is_dir() else []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                groups = (proc / "cgroup").read_text()
            except OSError:
                continue
            if str(self.root) in command or any(cid in groups for cid in ids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)

    def _mounts(self) -> list[str]:
        with open("/proc/mounts") as mounts:
            points = [line.split()[1] for line in mounts]
        return [point for point in points if point.startswith(str(self.root))]

    def log_tail(self, lines: int = 20) -> str:
        path = self.root / "dockerd.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])
