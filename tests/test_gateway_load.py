"""Load: 500 concurrent streaming calls through one gateway, every one recorded exactly once,
with the memory the gateway holds bounded by chunks, not by whole streams."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

import aiohttp
import pytest

from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS, ModelApi
from pytest_hemra.store import Store
from tests.upstream import MODEL, USAGE, running_upstream

CALLS = 500
TRIALS = 10
CHUNKS, CHUNK_BYTES = 200, 5000  # ~1 MB a stream, ~500 MB through the gateway in all


async def stream_all(urls: list[tuple[str, str]]) -> list[int]:
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {"x-test-chunks": str(CHUNKS), "x-test-chunk-bytes": str(CHUNK_BYTES)}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:

        async def one(base: str, token: str) -> int:
            size = 0
            async with session.post(
                f"{base}/v1/messages", json=body, headers={**headers, "x-api-key": token}
            ) as response:
                assert response.status == 200
                async for chunk in response.content.iter_any():
                    size += len(chunk)
            return size

        return await asyncio.gather(*(one(base, token) for base, token in urls))


@pytest.mark.slow
def test_500_concurrent_streams_are_each_recorded_once_in_bounded_memory(tmp_path: Path) -> None:
    store = Store(tmp_path / "load.db")
    with running_upstream() as upstream:
        providers = {
            **BUILTIN_UPSTREAMS,
            "anthropic": ModelApi(name="anthropic", base_url=upstream.url, auth="x-api-key"),
        }
        with Gateway(providers, store.record_call) as gateway:
            accesses = [
                gateway.open_trial(f"r.{n}", "r", keys={"anthropic": "k"}) for n in range(TRIALS)
            ]
            urls = [
                (accesses[n % TRIALS].base_url("127.0.0.1"), accesses[n % TRIALS].token)
                for n in range(CALLS)
            ]
            tracemalloc.start()
            sizes = asyncio.run(stream_all(urls))
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            totals = [gateway.close_trial(access.token) for access in accesses]

    streamed = sum(sizes)
    assert len(sizes) == CALLS and min(sizes) > CHUNKS * CHUNK_BYTES
    # Each stream is ~1 MB; buffering whole streams would hold more than that per call at the
    # peak. Chunked forwarding holds a few socket buffers a call (client and upstream included).
    per_call = peak / CALLS
    assert per_call < CHUNKS * CHUNK_BYTES / 2, f"{per_call / 1e3:.0f} kB held per call"
    rows = store.calls(run_id="r")
    assert len(rows) == CALLS
    assert all(r.status == 200 and r.error is None for r in rows)
    assert sum(r.response_bytes for r in rows) == streamed
    for n, total in enumerate(totals):
        mine = [r for r in rows if r.trial_id == f"r.{n}"]
        assert len(mine) == total.calls == CALLS // TRIALS
        assert (
            total.output_tokens
            == sum(r.output_tokens for r in mine)
            == USAGE["output_tokens"] * len(mine)
        )
