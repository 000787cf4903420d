"""A Docker engine made slow: a proxy on a Unix socket of the test's own, in front of the real
engine's, that holds back the answers to the first `slow_starts` container starts for `delay`
seconds (the start itself reaches the engine at once, as on an overloaded engine that starts
the container and answers late), and passes everything else through as it comes, pings
included, and hijacked streams (an exec's attach) byte for byte. It records every request
line it passes (`requests`): with no slow starts, it is the engine's request counter.

The Docker SDK asks one request at a time on a connection, so the answer that follows a start's
request line on a connection is the start's."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from pathlib import Path

ENGINE_SOCKET = "/var/run/docker.sock"
REQUEST = re.compile(rb"^(GET|POST|PUT|DELETE|HEAD) /")
START = re.compile(rb"^POST /[^ ]*containers/[^/ ]+/start[ ?]")


class SlowEngine:
    def __init__(self, socket: Path, delay: float, slow_starts: int) -> None:
        self.socket = socket
        self.delay = delay
        self.left = slow_starts  # starts still to answer late
        self.starts = 0
        self.held = 0  # answers held back
        self.requests: list[str] = []  # every request line (method and path), in order
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def address(self) -> str:
        return f"unix://{self.socket}"

    def __enter__(self) -> SlowEngine:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the slow engine's proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_unix_server(self._connection, path=str(self.socket))
        )
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            # connections a client kept open: ended here, not left pending when the loop is
            # collected ("Task was destroyed but it is pending!" at the session's exit)
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _connection(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        engine_r, engine_w = await asyncio.open_unix_connection(ENGINE_SOCKET)
        holds: list[float] = []  # delays owed to the next answers on this connection

        async def requests() -> None:
            while data := await client_r.read(65536):
                if REQUEST.match(data):
                    self.requests.append(data.split(b" HTTP/", 1)[0].decode("latin-1"))
                if START.match(data):
                    self.starts += 1
                    if self.left > 0:
                        self.left -= 1
                        holds.append(self.delay)
                engine_w.write(data)
                await engine_w.drain()
            engine_w.close()

        async def answers() -> None:
            while data := await engine_r.read(65536):
                if holds:
                    self.held += 1
                    await asyncio.sleep(holds.pop(0))
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        with contextlib.suppress(OSError, asyncio.CancelledError):
            await asyncio.gather(requests(), answers())
        for writer in (client_w, engine_w):
            writer.close()
