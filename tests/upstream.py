"""A real aiohttp model API for tests and benchmarks: answers like Anthropic (Messages) and
OpenAI (Chat Completions, Responses), streamed or not, and misbehaves on request (`x-test-mode`:
reset mid-stream, 429, 500, slow first byte; a revoked key: 401; echo the key; usage cut across
two writes); any other path answers 200 and is recorded in `seen`.

Chat streams follow OpenAI: usage only when the request asks (`stream_options.include_usage`),
then `"usage": null` on every chunk and one usage-only chunk before `[DONE]`. A bulk stream
(`x-test-event-bytes`, `x-test-stream-bytes`) writes many events of one size per write, as a
fast upstream's bytes arrive at a proxy: what the benchmark measures the gateway with.

Wire quirks real upstreams have, each asked for by a header and combinable with the modes:
`x-test-encoding: gzip` compresses plain and streamed answers although the gateway asks for
`identity` (a stream flushed event by event, as a compressing proxy does); `x-test-keep-alive:
SECS` starts a stream with an SSE comment and waits SECS between its writes; `x-test-sse-fields`
gives Chat chunks `id:` and `event:` lines; `x-test-unicode` puts non-ASCII text in Chat chunks
(the finishing one too), written as UTF-8; `x-test-final-bytes: N` makes a Responses stream's final
event longer than N bytes (its output text); `x-test-mode: error-event` ends an Anthropic
stream with an `error` event after its first delta."""

from __future__ import annotations

import asyncio
import functools
import gzip
import itertools
import json
import socket
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

USAGE = {"input_tokens": 11, "output_tokens": 7, "cache_read": 3, "cache_write": 2}
MODEL = "claude-sonnet-4-5-20250929"
CHAT_MODEL = "gpt-4.1"
# what the chat and Responses wires report: 20 input of which 5 cached, 4 output
OPENAI_USAGE = {"input": 20, "cached": 5, "output": 4}
BULK_WRITE_BYTES = 64 * 1024  # a bulk stream's events are written this many bytes at a time
REVOKED_KEY = "sk-revoked"  # an x-api-key starting so is answered 401, as a revoked key is


@dataclass
class Upstream:
    url: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)


STATE = web.AppKey("state", Upstream)  # the upstream's record of what it was sent


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


class _Stream(web.StreamResponse):
    """A streamed answer as the request's `x-test-encoding` and `x-test-keep-alive` shape it:
    gzip flushed write by write; a `: keep-alive` comment first, then a wait before each write."""

    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        is_gzip = request.headers.get("x-test-encoding") == "gzip"
        super().__init__(headers={**headers, **({"Content-Encoding": "gzip"} if is_gzip else {})})
        self._gzip = zlib.compressobj(wbits=31) if is_gzip else None
        self._comment_wait = request.headers.get("x-test-keep-alive")
        self._is_finished = False

    async def prepare(self, request: web.BaseRequest) -> Any:
        is_new = not self.prepared  # aiohttp prepares a handler's answer again once it returns
        writer = await super().prepare(request)
        if self._comment_wait is not None and is_new:
            await self._write(b": keep-alive\n\n")
        return writer

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._comment_wait is not None:
            await asyncio.sleep(float(self._comment_wait))
        await self._write(bytes(data))

    async def _write(self, data: bytes) -> None:
        if self._gzip is not None:
            data = self._gzip.compress(data) + self._gzip.flush(zlib.Z_SYNC_FLUSH)
        await super().write(data)

    async def write_eof(self, data: bytes = b"") -> None:
        if self._is_finished:
            return
        self._is_finished = True
        if self._gzip is not None:
            data = self._gzip.compress(data) + self._gzip.flush()
        await super().write_eof(data)


def _answer(request: web.Request, payload: dict[str, Any], **options: Any) -> web.Response:
    """A plain JSON answer, gzipped when `x-test-encoding: gzip` asks."""
    if request.headers.get("x-test-encoding") != "gzip":
        return web.json_response(payload, **options)
    body = gzip.compress(json.dumps(payload).encode(), mtime=0)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    return web.Response(body=body, headers={**headers, **options.pop("headers", {})}, **options)


async def messages(request: web.Request) -> web.StreamResponse:
    state: Upstream = request.app[STATE]
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
    if "x-test-event-bytes" in request.headers:
        head = _sse("message_start", _message_start(MODEL))
        return await bulk_stream(request, anthropic_delta, head, _anthropic_end())
    model = body.get("model", MODEL)
    if not body.get("stream"):
        answer = _answer(
            request,
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": "hello"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": _anthropic_usage(),
            },
        )
        if mode == "set-cookie":  # as a provider's edge does (Cloudflare's `__cf_bm`)
            answer.set_cookie("__cf_bm", "set-for-one-caller", path="/")
        return await cut_short(request, answer) if mode == "reset" else answer
    response = _Stream(request, {"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_sse("message_start", _message_start(model)))
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    block["content_block"]["text"] = ""  # type: ignore[index]
    await response.write(_sse("content_block_start", block))
    chunks = int(request.headers.get("x-test-chunks", "3"))
    piece = "x" * int(request.headers.get("x-test-chunk-bytes", "5"))
    for index in range(chunks):
        await response.write(anthropic_delta(piece))
        if mode == "error-event" and index == 0:
            await response.write(_sse("error", OVERLOADED))
            await response.write_eof()
            return response
        if mode == "reset" and index == 0:
            assert request.transport is not None
            request.transport.abort()
            return response
        if mode == "drip":
            await asyncio.sleep(0.2)
    await response.write(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    await _write_usage(response, _anthropic_end(), mode)
    await response.write_eof()
    return response


async def _write_usage(response: web.StreamResponse, data: bytes, mode: str) -> None:
    """The events that carry usage; `split-usage` cuts them in two writes, mid-usage."""
    if mode != "split-usage":
        await response.write(data)
        return
    cut = data.index(b"_tokens") + 3
    for piece in (data[:cut], data[cut:]):
        await response.write(piece)
        await asyncio.sleep(0.05)  # two chunks on the wire, the usage cut between them


async def cut_short(request: web.Request, answer: web.Response) -> web.StreamResponse:
    """A plain answer whose connection drops halfway through its declared length."""
    body = bytes(answer.body)  # type: ignore[arg-type]
    response = web.StreamResponse(
        headers={"Content-Type": "application/json", "Content-Length": str(len(body))}
    )
    await response.prepare(request)
    await response.write(body[: len(body) // 2])
    assert request.transport is not None
    request.transport.abort()
    return response


async def echo_key(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """A careless upstream: the key it was sent comes back in a header and in the body (in a
    stream, split across two writes)."""
    key = request.headers.get("x-api-key", "")
    if not body.get("stream"):
        return _answer(
            request,
            {"type": "error", "error": {"type": "authentication_error", "message": f"bad {key}"}},
            status=401,
            headers={"x-echo": key},
        )
    response = _Stream(request, {"Content-Type": "text/event-stream", "x-echo": key})
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
    state: Upstream = request.app[STATE]
    state.seen.append({"path": request.path, "headers": dict(request.headers), "body": None})
    return web.json_response({"ok": True})


def _padded(make: Callable[[str], bytes], size: int) -> bytes:
    """An event of exactly `size` bytes (or as small as it can be), its text padded with x."""
    bare = make("")
    return make("x" * max(0, size - len(bare)))


def anthropic_delta(text: str) -> bytes:
    payload = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}
    payload["delta"]["text"] = text  # type: ignore[index]
    return _sse("content_block_delta", payload)


async def bulk_stream(
    request: web.Request, make_event: Callable[[str], bytes], head: bytes, tail: bytes
) -> web.StreamResponse:
    """`head`, then many events of `x-test-event-bytes` each, `x-test-stream-bytes` in all,
    written BULK_WRITE_BYTES at a time, then `tail` (the wire's usage-bearing events)."""
    event = _padded(make_event, int(request.headers["x-test-event-bytes"]))
    total = int(request.headers.get("x-test-stream-bytes", "1000000"))
    batch = event * max(1, BULK_WRITE_BYTES // len(event))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if head:
        await response.write(head)
    sent = 0
    while sent < total:
        await response.write(batch)
        sent += len(batch)
    await response.write(tail)
    await response.write_eof()
    return response


def _anthropic_usage() -> dict[str, int]:
    return {
        "input_tokens": USAGE["input_tokens"],
        "output_tokens": USAGE["output_tokens"],
        "cache_read_input_tokens": USAGE["cache_read"],
        "cache_creation_input_tokens": USAGE["cache_write"],
    }


def _message_start(model: str) -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**_anthropic_usage(), "output_tokens": 1},
    }
    return {"type": "message_start", "message": message}


def _anthropic_end() -> bytes:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": USAGE["output_tokens"]},
    }
    return _sse("message_delta", delta) + _sse("message_stop", {"type": "message_stop"})


# ---- OpenAI Chat Completions -------------------------------------------------------------------

DONE = b"data: [DONE]\n\n"


def _chat_usage() -> dict[str, Any]:
    return {
        "prompt_tokens": OPENAI_USAGE["input"],
        "completion_tokens": OPENAI_USAGE["output"],
        "total_tokens": OPENAI_USAGE["input"] + OPENAI_USAGE["output"],
        "prompt_tokens_details": {"cached_tokens": OPENAI_USAGE["cached"]},
    }


def _chat_data(payload: dict[str, Any]) -> bytes:
    """One chunk as OpenAI writes it: compact JSON in UTF-8, `data: ` and a blank line."""
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return b"data: " + data + b"\n\n"


def _chat_chunk(
    choices: list[dict[str, Any]], model: str, usage: Any = ..., *, with_usage: bool = True
) -> dict[str, Any]:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": choices,
    }
    if with_usage:
        chunk["usage"] = None if usage is ... else usage
    return chunk


def chat_delta(text: str, *, with_usage: bool = False) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    return _chat_data(_chat_chunk([choice], CHAT_MODEL, with_usage=with_usage))


async def chat(request: web.Request) -> web.StreamResponse:
    """Chat Completions; streamed as OpenAI streams (`x-test-mode`: `reset` cuts the stream after
    its first delta, `no-usage` ignores `stream_options` as some compatible servers do,
    `usage-on-finish` puts usage on the finishing chunk instead of a chunk of its own,
    `split-usage` writes the usage chunk in two halves)."""
    state: Upstream = request.app[STATE]
    body = await request.json()
    state.seen.append({"path": request.path, "headers": dict(request.headers), "body": body})
    model = body.get("model") or CHAT_MODEL
    if not body.get("stream"):
        message: dict[str, Any] = {"role": "assistant", "content": "hi"}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        return _answer(
            request,
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": model,
                "choices": [choice],
                "usage": _chat_usage(),
            },
        )
    mode = request.headers.get("x-test-mode", "")
    options = body.get("stream_options") or {}
    asked = options.get("include_usage") is True and mode != "no-usage"
    if "x-test-event-bytes" in request.headers:
        usage = _chat_data(_chat_chunk([], model, _chat_usage())) if asked else b""
        delta = functools.partial(chat_delta, with_usage=asked)
        return await bulk_stream(request, delta, b"", usage + DONE)
    response = _Stream(request, {"Content-Type": "text/event-stream"})
    await response.prepare(request)
    numbered = itertools.count(1)
    is_unicode = "x-test-unicode" in request.headers

    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = ...) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        data = _chat_data(_chat_chunk([choice], model, usage, with_usage=asked))
        if "x-test-sse-fields" in request.headers:
            return f"id: {next(numbered)}\nevent: chunk\n".encode() + data
        return data

    await response.write(chunk({"role": "assistant", "content": ""}))
    for index, word in enumerate(("hé", "llo ✓") if is_unicode else ("hel", "lo")):
        await response.write(chunk({"content": word}))
        if mode == "reset" and index == 0:
            assert request.transport is not None
            request.transport.abort()
            return response
        if mode == "drip":
            await asyncio.sleep(0.2)
    last = {"content": " café"} if is_unicode else {}
    if asked and mode == "usage-on-finish":
        await response.write(chunk(last, "stop", _chat_usage()))
    else:
        await response.write(chunk(last, "stop"))
        if asked:
            await _write_usage(response, _chat_data(_chat_chunk([], model, _chat_usage())), mode)
    await response.write(DONE)
    await response.write_eof()
    return response


# ---- OpenAI Responses --------------------------------------------------------------------------


def _responses_usage() -> dict[str, Any]:
    return {
        "input_tokens": OPENAI_USAGE["input"],
        "input_tokens_details": {"cached_tokens": OPENAI_USAGE["cached"]},
        "output_tokens": OPENAI_USAGE["output"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": OPENAI_USAGE["input"] + OPENAI_USAGE["output"],
    }


async def responses(request: web.Request) -> web.StreamResponse:
    """The Responses API; `x-test-mode: reset` cuts a stream after its first delta."""
    state: Upstream = request.app[STATE]
    body = await request.json()
    state.seen.append({"path": request.path, "headers": dict(request.headers), "body": body})
    model = body.get("model") or CHAT_MODEL
    padding = "y" * int(request.headers.get("x-test-final-bytes", "0"))
    text = {"type": "output_text", "text": "hello" + padding, "annotations": []}
    item: dict[str, Any] = {"type": "message", "id": "msg_1", "role": "assistant"}
    item |= {"status": "completed", "content": [text]}
    done = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": model,
        "output": [item],
        "usage": _responses_usage(),
    }
    if not body.get("stream"):
        return _answer(request, done)
    response = _Stream(request, {"Content-Type": "text/event-stream"})
    await response.prepare(request)
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    created = {"type": "response.created", "response": started}
    await response.write(_sse("response.created", created))
    for index, piece in enumerate(("hel", "lo")):
        delta = {"type": "response.output_text.delta", "item_id": "msg_1", "delta": piece}
        await response.write(_sse("response.output_text.delta", delta))
        if request.headers.get("x-test-mode") == "reset" and index == 0:
            assert request.transport is not None
            request.transport.abort()
            return response
    await response.write(
        _sse("response.completed", {"type": "response.completed", "response": done})
    )
    await response.write_eof()
    return response


async def models(request: web.Request) -> web.Response:
    state: Upstream = request.app[STATE]
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
        app[STATE] = state
        app.router.add_post("/v1/messages", messages)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/v1/responses", responses)
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
        loop.close()


def closed_port() -> int:
    """A loopback port nothing listens on (an upstream that is down)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
