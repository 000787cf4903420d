"""The gateway against a direct connection to the same local upstream, measured in one run.

The upstream (tests/upstream.py, a real aiohttp server) and the gateway each run in a process
of their own; the client is this process. Every measurement is taken direct and through the
gateway, interleaved, and printed with its ratio:

- added median latency of a non-streamed request      (target: under 1 ms)
- time to the first streamed byte                     (target: within 1 ms of direct)
- streamed throughput with 100-byte, 4 KB and 16 KB events on the Anthropic wire, and with
  100-byte events on Chat Completions from a client that did not ask for usage (the gateway
  asks for it and takes the usage chunk out)      (target: at least 0.5x direct)
- the gateway process's CPU time per MiB of each stream (Linux): what its speed costs,
  whatever else the machine runs
- the ceiling of any relay on this machine: the same streams through a raw TCP pipe (its own
  process, asyncio, bytes passed on as they arrive: no HTTP parsed, nothing read or counted).
  On a machine of few CPUs a relay is a third busy process beside upstream and client; the
  pipe's ratio is the most a gateway could reach there

The upstream writes a stream's events 64 KB at a time, as a fast upstream's bytes reach a proxy:
the gateway's cost per event, not the upstream's per write, is what small events show.

    python benchmarks/gateway.py [--requests 400] [--stream-mb 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS, ModelApi
from tests.upstream import CHAT_MODEL, MODEL, running_upstream

# keys as long as real ones (Anthropic's are 108 characters, OpenAI's project keys 164): the
# gateway scrubs every key it holds out of every answer, and a key's length sets that cost
KEYS = {"anthropic": "sk-ant-api03-" + "k" * 95, "openai": "sk-proj-" + "q" * 156}
BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
CHAT_BODY = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}]}
# (label, path, body, event bytes)
STREAMS = (
    ("anthropic, 100 B events", "v1/messages", BODY, 100),
    ("anthropic, 4 KB events ", "v1/messages", BODY, 4_000),
    ("anthropic, 16 KB events", "v1/messages", BODY, 16_000),
    ("chat, 100 B events     ", "v1/chat/completions", CHAT_BODY, 100),
)


@dataclass(frozen=True)
class Target:
    base: str
    key: str

    def headers(self, **more: str) -> dict[str, str]:
        return {"x-api-key": self.key, "Authorization": f"Bearer {self.key}", **more}


def serve_upstream(queue: Any, done: Event) -> None:
    with running_upstream() as upstream:
        queue.put(upstream.url)
        done.wait()


def serve_gateway(upstream_url: str, queue: Any, done: Event) -> None:
    providers = {
        **BUILTIN_UPSTREAMS,
        "anthropic": ModelApi(name="anthropic", base_url=upstream_url, auth="x-api-key"),
        "openai": ModelApi(name="openai", base_url=upstream_url, auth="bearer"),
    }
    with Gateway(providers, lambda call: None) as gateway:
        access = gateway.open_trial("bench.1", "bench", keys=KEYS)
        queue.put((access.base_url("127.0.0.1"), access.token))
        done.wait()


class _Pipe(asyncio.Protocol):
    """One side of the raw pipe: what arrives is written to the other side as it is."""

    def __init__(self, loop: asyncio.AbstractEventLoop, upstream: tuple[str, int] | None) -> None:
        self.loop = loop
        self.upstream = upstream  # the client's side dials it; the upstream's side has None
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.upstream is not None:
            transport.pause_reading()
            self.loop.create_task(self._dial(*self.upstream))

    async def _dial(self, host: str, port: int) -> None:
        other = _Pipe(self.loop, None)
        other.peer = self
        await self.loop.create_connection(lambda: other, host, port)
        self.peer = other
        assert self.transport is not None
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


def serve_pipe(upstream_url: str, queue: Any, done: Event) -> None:
    """The raw TCP pipe to the upstream (the ceiling of any relay here)."""
    address = upstream_url.split("//", 1)[1].rstrip("/").rsplit(":", 1)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        upstream = (address[0], int(address[1]))
        server = await loop.create_server(lambda: _Pipe(loop, upstream), "127.0.0.1", 0)
        queue.put(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        await loop.run_in_executor(None, done.wait)
        server.close()

    asyncio.run(serve())


async def plain(session: aiohttp.ClientSession, target: Target) -> float:
    started = time.perf_counter()
    async with session.post(
        f"{target.base}/v1/messages", json=BODY, headers=target.headers()
    ) as response:
        await response.read()
    return time.perf_counter() - started


async def first_byte(session: aiohttp.ClientSession, target: Target) -> float:
    started = time.perf_counter()
    async with session.post(
        f"{target.base}/v1/messages", json={**BODY, "stream": True}, headers=target.headers()
    ) as response:
        await response.content.readany()
        elapsed = time.perf_counter() - started
        await response.read()
    return elapsed


async def throughput(
    session: aiohttp.ClientSession,
    target: Target,
    path: str,
    body: dict[str, Any],
    event_bytes: int,
    megabytes: int,
) -> float:
    headers = target.headers(
        **{"x-test-event-bytes": str(event_bytes), "x-test-stream-bytes": str(megabytes << 20)}
    )
    started = time.perf_counter()
    size = 0
    async with session.post(
        f"{target.base}/{path}", json={**body, "stream": True}, headers=headers
    ) as response:
        assert response.status == 200, await response.text()
        async for data in response.content.iter_any():
            size += len(data)
    return size / (time.perf_counter() - started) / 1e6


def cpu_seconds(pid: int) -> float | None:
    """A process's CPU time (user and system) so far, where Linux's /proc tells it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    direct: Target,
    gateway: Target,
    pipe: Target,
    requests: int,
    megabytes: int,
    repeats: int,
    gateway_pid: int,
    pipe_pid: int,
) -> dict[str, tuple[float, float]]:
    """Medians direct and through the gateway; for each stream also the CPU milliseconds per MiB
    streamed of the gateway's process and of the raw pipe's (`<label> cpu`, figures the
    machine's other load moves less than the ratio: on few CPUs a relay is a third busy process
    beside upstream and client) and the throughput through the raw pipe (`<label> pipe`)."""
    results: dict[str, tuple[float, float]] = {}
    targets = (direct, gateway)
    async with aiohttp.ClientSession() as session:
        for target in targets:  # warm connections both ways
            for _ in range(20):
                await plain(session, target)
        for name, probe in (("plain", plain), ("first_byte", first_byte)):
            times: dict[int, list[float]] = {0: [], 1: []}
            for _ in range(requests):
                for index, target in enumerate(targets):
                    times[index].append(await probe(session, target))
            results[name] = (statistics.median(times[0]), statistics.median(times[1]))
        for label, path, body, size in STREAMS:
            rates: dict[int, list[float]] = {0: [], 1: [], 2: []}
            busy = {1: 0.0, 2: 0.0}
            relays = {1: gateway_pid, 2: pipe_pid}
            for _ in range(repeats):
                for index, target in enumerate((*targets, pipe)):
                    before = cpu_seconds(relays.get(index, 0))
                    rate = await throughput(session, target, path, body, size, megabytes)
                    after = cpu_seconds(relays.get(index, 0))
                    rates[index].append(rate)
                    if index in busy and before is not None and after is not None:
                        busy[index] += after - before
            results[label] = (statistics.median(rates[0]), statistics.median(rates[1]))
            streamed = repeats * megabytes
            results[f"{label} cpu"] = (busy[1] * 1e3 / streamed, busy[2] * 1e3 / streamed)
            results[f"{label} pipe"] = (statistics.median(rates[2]), 0.0)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--stream-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    done = context.Event()
    queue = context.Queue()
    upstream = context.Process(target=serve_upstream, args=(queue, done), daemon=True)
    upstream.start()
    upstream_url = queue.get(timeout=30)
    gateway = context.Process(target=serve_gateway, args=(upstream_url, queue, done), daemon=True)
    gateway.start()
    gateway_url, token = queue.get(timeout=30)
    pipe = context.Process(target=serve_pipe, args=(upstream_url, queue, done), daemon=True)
    pipe.start()
    pipe_url = queue.get(timeout=30)
    try:
        results = asyncio.run(
            measure(
                Target(upstream_url, "sk-bench"),
                Target(gateway_url, token),
                Target(pipe_url, "sk-bench"),
                args.requests,
                args.stream_mb,
                args.repeats,
                gateway.pid or 0,
                pipe.pid or 0,
            )
        )
    finally:
        done.set()
        gateway.join(timeout=10)
        pipe.join(timeout=10)
        upstream.join(timeout=10)
    print(
        f"{args.requests} requests each way, interleaved; streams of {args.stream_mb} MiB,"
        f" median of {args.repeats} each way"
    )
    for name, label in (("plain", "non-streamed latency"), ("first_byte", "first streamed byte ")):
        direct, through = results[name]
        print(
            f"{label}     direct {direct * 1e3:7.2f} ms    gateway {through * 1e3:7.2f} ms"
            f"    added {(through - direct) * 1e3:5.2f} ms (target < 1 ms)"
            f"    ratio {through / direct:.2f}x"
        )
    for label, *_ in STREAMS:
        direct, through = results[label]
        cpu, pipe_cpu = results[f"{label} cpu"]
        piped, _ = results[f"{label} pipe"]
        print(
            f"throughput {label}  direct {direct:7.1f} MB/s gateway {through:7.1f} MB/s"
            f"    ratio {through / direct:.2f}x (target >= 0.5x)    gateway CPU {cpu:.2f} ms/MiB"
            f"    raw pipe {piped / direct:.2f}x (the ceiling here), CPU {pipe_cpu:.2f} ms/MiB"
        )


if __name__ == "__main__":
    main()
