"""The viewer's server: aiohttp on its own event loop in a thread.

`hemra serve` keeps its main thread for the supervisor (and its SIGINT/SIGTERM handlers) and
runs the viewer beside it; `hemra view` runs the viewer alone until a signal. Bound to anything
but loopback, the viewer requires a token: HEMRA_VIEWER_TOKEN, else a fresh random one, printed
in the address at start.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import secrets
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from aiohttp import web

from pytest_hemra.core.errors import HemraError
from pytest_hemra.viewer.app import make_app

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
TOKEN_ENV = "HEMRA_VIEWER_TOKEN"
START_SECS = 30.0
STOP_SECS = 10.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def viewer_token(host: str) -> str | None:
    """The token every request must carry: HEMRA_VIEWER_TOKEN if set, else a random one when
    bound beyond loopback, else none."""
    return os.environ.get(TOKEN_ENV) or (None if is_loopback(host) else secrets.token_urlsafe(24))


class ViewerThread:
    def __init__(self, store_path: str | Path, host: str, port: int) -> None:
        self.store_path = store_path
        self.host = host
        self.port = port
        self.token = viewer_token(host)
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="hemra-viewer", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def announcement(self) -> str:
        if self.token is None:
            return f"hemra viewer: {self.url}"
        reason = "set" if os.environ.get(TOKEN_ENV) else "bound beyond loopback"
        return (
            f"hemra viewer: {self.url}?token={self.token}\n"
            f"hemra viewer: {reason}: every request needs this token (?token=, the cookie it"
            f" sets, or 'Authorization: Bearer TOKEN'); without it, 401"
        )

    def start(self) -> None:
        """Listen, or raise a HemraError saying why not."""
        self._thread.start()
        if not self._ready.wait(START_SECS):
            raise HemraError(
                f"viewer: not listening on {self.host}:{self.port} after {START_SECS}s"
            )
        if self._failure is not None:
            raise HemraError(
                f"viewer: cannot listen on {self.host}:{self.port} ({self._failure});"
                " expected a free port (pass --port) and an address of this machine (--host)"
            )

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(STOP_SECS)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        app = make_app(
            self.store_path,
            token=self.token,
            is_loopback=is_loopback(self.host) and self.token is None,
        )
        runner = web.AppRunner(app, access_log=None)
        try:
            loop.run_until_complete(self._listen(runner))
        except (OSError, HemraError) as failure:
            self._failure = failure
            loop.run_until_complete(runner.cleanup())
            loop.close()
            self._ready.set()
            return
        self._loop = loop
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    async def _listen(self, runner: web.AppRunner) -> None:
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()
        self.port = int(runner.addresses[0][1])


@contextmanager
def running_viewer(
    store_path: str | Path, host: str, port: int, *, required: bool
) -> Iterator[ViewerThread | None]:
    """The viewer, listening for the block's length. When it cannot listen: an error if it is
    `required`, else a warning and None (`hemra serve` works the queue all the same)."""
    viewer = ViewerThread(store_path, host, port)
    try:
        viewer.start()
    except HemraError as error:
        if required:
            raise
        print(f"hemra serve: {error}; working the queue without it", file=sys.stderr, flush=True)
        yield None
        return
    print(viewer.announcement(), flush=True)
    try:
        yield viewer
    finally:
        viewer.stop()


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stopped = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopped.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
