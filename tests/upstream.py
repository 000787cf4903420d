"""A real aiohttp model API for tests and benchmarks: answers like Anthropic and OpenAI, and
misbehaves on request (`x-test-mode`: reset mid-stream, 429, 500, slow first byte; a revoked
key: 401; echo the key); any other path answers 200 and is recorded in `seen`."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

USAGE = {"input_tokens": 11, "output_tokens": 7, "cache_read": 3, "cache_write": 2}
MODEL = "claude-sonnet-4-5-20250929"
REVOKED_KEY = "sk-revoked"  # an x-api-key starting so is answered 401, as a revoked key is


@dataclass
class Upstream:
    url: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def messages(request: web.Request) -> web.StreamResponse:
    state: Upstream = request.app["state"]
    body = await request.json()
    state.seen.append({"path": request.path, "headers": dict(request.headers), "body": body})
    mode = request.headers.get("x-test-mode", "")
    if request.headers.get("x-api-key", "").startswith(REVOKED_KEY):
        return web.json_response(
            {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}},
            status=401,
        )
    if mode == "429":
        return web.json_response(
            {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
            status=429,
            headers={"retry-after": "0"},
        )
    if mode == "500":
        return web.json_response(
            {"type": "error", "error": {"type": "api_error", "message": "upstream broke"}},
            status=500,
        )
    if mode == "slow":
        await asyncio.sleep(float(request.headers.get("x-test-delay", "0.3")))
    if mode == "echo-key":
        return await echo_key(request, body)
    model = body.get("model", MODEL)
    usage = {
        "input_tokens": USAGE["input_tokens"],
        "output_tokens": USAGE["output_tokens"],
        "cache_read_input_tokens": USAGE["cache_read"],
        "cache_creation_input_tokens": USAGE["cache_write"],
    }
    if not body.get("stream"):
        return web.json_response(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": "hello"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": usage,
            }
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    start_usage = {**usage, "output_tokens": 1}
    await response.write(
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        )
    )
    await response.write(
        _sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
    )
    chunks = int(request.headers.get("x-test-chunks", "3"))
    piece = "x" * int(request.headers.get("x-test-chunk-bytes", "5"))
    for index in range(chunks):
        await response.write(
            _sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": piece},
                },
            )
        )
        if mode == "reset" and index == 0:
            assert request.transport is not None
            request.transport.abort()
            return response
        if mode == "drip":
            await asyncio.sleep(0.2)
    await response.write(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    await response.write(
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": USAGE["output_tokens"]},
            },
        )
    )
    await response.write(_sse("message_stop", {"type": "message_stop"}))
    await response.write_eof()
    return response


async def echo_key(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """A careless upstream: the key it was sent comes back in a header and in the body (in a
    stream, split across two writes)."""
    key = request.headers.get("x-api-key", "")
    if not body.get("stream"):
        return web.json_response(
            {"type": "error", "error": {"type": "authentication_error", "message": f"bad {key}"}},
            status=401,
            headers={"x-echo": key},
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-echo": key})
    await response.prepare(request)
    event = _sse("error", {"type": "error", "error": {"type": "api_error", "message": key}})
    cut = event.index(key.encode()) + len(key) // 2
    for piece in (event[:cut], event[cut:]):
        await response.write(piece)
        await asyncio.sleep(0.05)  # two chunks on the wire, the key cut between them
    await response.write_eof()
    return response


async def anything(request: web.Request) -> web.Response:
    """Any other path answers 200: a call the gateway forwarded would succeed, and be seen."""
    state: Upstream = request.app["state"]
    state.seen.append({"path": request.path, "headers": dict(request.headers), "body": None})
    return web.json_response({"ok": True})


async def chat(request: web.Request) -> web.StreamResponse:
    state: Upstream = request.app["state"]
    body = await request.json()
    state.seen.append({"path": request.path, "headers": dict(request.headers), "body": body})
    return web.json_response(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4.1",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "hi"},
                }
            ],
            "usage": {
                "prompt_tokens": 20,
                "completion_tokens": 4,
                "total_tokens": 24,
                "prompt_tokens_details": {"cached_tokens": 5},
            },
        }
    )


async def models(request: web.Request) -> web.Response:
    state: Upstream = request.app["state"]
    state.seen.append({"path": request.path, "headers": dict(request.headers), "body": None})
    return web.json_response({"data": [{"id": MODEL}]})


@contextmanager
def running_upstream() -> Iterator[Upstream]:
    """Serve the upstream on 127.0.0.1 from a thread of its own."""
    state = Upstream()
    loop = asyncio.new_event_loop()
    ready: Future[web.AppRunner] = Future()

    async def serve() -> web.AppRunner:
        app = web.Application()
        app["state"] = state
        app.router.add_post("/v1/messages", messages)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        app.router.add_route("*", "/{tail:.*}", anything)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state.url = f"http://127.0.0.1:{port}"
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        ready.set_result(loop.run_until_complete(serve()))
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    runner = ready.result(timeout=10)
    try:
        yield state
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def closed_port() -> int:
    """A loopback port nothing listens on (an upstream that is down)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
