"""The gateway against a direct connection to the same local upstream, measured in one run.

The upstream (tests/upstream.py, a real aiohttp server) and the gateway each run in a process
of their own; the client is this process. Three measurements, each direct and through the
gateway, interleaved:

- added median latency of a non-streamed request      (target: under 1 ms)
- time to the first streamed byte                     (target: within 1 ms of direct)
- throughput of a large SSE stream                     (target: at least 0.9x direct)

    python benchmarks/gateway.py [--requests 400] [--stream-mb 32]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS, ModelApi
from tests.upstream import MODEL, running_upstream

BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def serve_upstream(queue: Any, done: Event) -> None:
    with running_upstream() as upstream:
        queue.put(upstream.url)
        done.wait()


def serve_gateway(upstream_url: str, queue: Any, done: Event) -> None:
    providers = {
        **BUILTIN_UPSTREAMS,
        "anthropic": ModelApi(name="anthropic", base_url=upstream_url, auth="x-api-key"),
    }
    with Gateway(providers, lambda call: None) as gateway:
        access = gateway.open_trial("bench.1", "bench", keys={"anthropic": "sk-bench"})
        queue.put((access.base_url("127.0.0.1"), access.token))
        done.wait()


async def plain(session: aiohttp.ClientSession, base: str, key: str) -> float:
    started = time.perf_counter()
    async with session.post(f"{base}/v1/messages", json=BODY, headers={"x-api-key": key}) as r:
        await r.read()
    return time.perf_counter() - started


async def first_byte(session: aiohttp.ClientSession, base: str, key: str) -> float:
    started = time.perf_counter()
    async with session.post(
        f"{base}/v1/messages", json={**BODY, "stream": True}, headers={"x-api-key": key}
    ) as response:
        await response.content.readany()
        elapsed = time.perf_counter() - started
        await response.read()
    return elapsed


async def throughput(session: aiohttp.ClientSession, base: str, key: str, megabytes: int) -> float:
    chunk = 16_000
    headers = {
        "x-api-key": key,
        "x-test-chunks": str(megabytes * 1_000_000 // chunk),
        "x-test-chunk-bytes": str(chunk),
    }
    started = time.perf_counter()
    size = 0
    async with session.post(
        f"{base}/v1/messages", json={**BODY, "stream": True}, headers=headers
    ) as response:
        async for data in response.content.iter_any():
            size += len(data)
    return size / (time.perf_counter() - started) / 1e6


async def measure(
    direct: tuple[str, str], gateway: tuple[str, str], requests: int, megabytes: int
) -> dict[str, tuple[float, float]]:
    results: dict[str, tuple[float, float]] = {}
    async with aiohttp.ClientSession() as session:
        for target in (direct, gateway):  # warm connections both ways
            for _ in range(20):
                await plain(session, *target)
        for name, probe in (("plain", plain), ("first_byte", first_byte)):
            times: dict[int, list[float]] = {0: [], 1: []}
            for _ in range(requests):
                for index, target in enumerate((direct, gateway)):
                    times[index].append(await probe(session, *target))
            results[name] = (statistics.median(times[0]), statistics.median(times[1]))
        rates: dict[int, list[float]] = {0: [], 1: []}
        for _ in range(3):
            for index, target in enumerate((direct, gateway)):
                rates[index].append(await throughput(session, *target, megabytes))
        results["throughput"] = (statistics.median(rates[0]), statistics.median(rates[1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--stream-mb", type=int, default=32)
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
    try:
        results = asyncio.run(
            measure((upstream_url, "sk-bench"), (gateway_url, token), args.requests, args.stream_mb)
        )
    finally:
        done.set()
        gateway.join(timeout=10)
        upstream.join(timeout=10)
    (direct_plain, gw_plain) = results["plain"]
    (direct_ttfb, gw_ttfb) = results["first_byte"]
    (direct_rate, gw_rate) = results["throughput"]
    print(f"{args.requests} requests each way, interleaved; stream of {args.stream_mb} MB x3")
    print(
        f"non-streamed median   direct {direct_plain * 1e3:6.2f} ms   gateway "
        f"{gw_plain * 1e3:6.2f} ms   added {(gw_plain - direct_plain) * 1e3:5.2f} ms "
        f"(target < 1 ms)   ratio {gw_plain / direct_plain:.2f}x"
    )
    print(
        f"first streamed byte   direct {direct_ttfb * 1e3:6.2f} ms   gateway "
        f"{gw_ttfb * 1e3:6.2f} ms   added {(gw_ttfb - direct_ttfb) * 1e3:5.2f} ms "
        f"(target < 1 ms)   ratio {gw_ttfb / direct_ttfb:.2f}x"
    )
    print(
        f"large SSE throughput  direct {direct_rate:6.1f} MB/s gateway {gw_rate:6.1f} MB/s "
        f"ratio {gw_rate / direct_rate:.2f}x (target >= 0.9x)"
    )


if __name__ == "__main__":
    main()
