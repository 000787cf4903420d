"""Token usage read from response bodies of every wire, however the bytes are chunked."""

from __future__ import annotations

import json
import random
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_hemra.execute.gateway.chatusage import AddedUsageFilter, with_usage_asked
from pytest_hemra.execute.gateway.usage import MAX_EVENT_BYTES, UsageReader, is_streaming
from pytest_hemra.execute.gateway.wire import CallUsage as Usage
from pytest_hemra.execute.gateway.wire import Wire

Feed = Callable[[bytes], Iterator[bytes]]


def whole(body: bytes) -> Iterator[bytes]:
    yield body


def byte_by_byte(body: bytes) -> Iterator[bytes]:
    for index in range(len(body)):
        yield body[index : index + 1]


def random_chunks(body: bytes) -> Iterator[bytes]:
    rng = random.Random(len(body))
    start = 0
    while start < len(body):
        size = rng.randint(1, 97)
        yield body[start : start + size]
        start += size


FEEDS = [whole, byte_by_byte, random_chunks]


def sse(*events: tuple[str | None, Any]) -> bytes:
    """An SSE body: `(event name or None, JSON payload or raw data string)` per event."""
    out = ""
    for name, payload in events:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        out += (f"event: {name}\n" if name else "") + f"data: {data}\n\n"
    return out.encode()


def read(wire: Wire, streaming: bool, body: bytes, feed: Feed = whole) -> Usage | None:
    reader = UsageReader(wire, streaming)
    for chunk in feed(body):
        reader.feed(chunk)
    return reader.result()


# Shapes as recorded from each provider (ids shortened, content trimmed).

ANTHROPIC_STREAM = sse(
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_01Xf",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5-20250929",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 2095,
                    "cache_creation_input_tokens": 1200,
                    "cache_read_input_tokens": 30000,
                    "output_tokens": 1,
                    "service_tier": "standard",
                },
            },
        },
    ),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ),
    ("ping", {"type": "ping"}),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": 'It says "usage": {"output_tokens": 9}'},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 250},
        },
    ),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 503},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
)
ANTHROPIC_STREAM_USAGE = Usage(2095, 503, 30000, 1200, "claude-sonnet-4-5-20250929")

ANTHROPIC_BODY = json.dumps(
    {
        "id": "msg_01Ab",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-4-5-20251001",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 12,
            "cache_creation_input_tokens": 40,
            "cache_read_input_tokens": 7,
            "output_tokens": 6,
        },
    }
).encode()

RESPONSES_USAGE_WIRE = {
    "input_tokens": 5000,
    "input_tokens_details": {"cached_tokens": 4096},
    "output_tokens": 300,
    "output_tokens_details": {"reasoning_tokens": 128},
    "total_tokens": 5300,
}


def responses_stream(final: str = "response.completed") -> bytes:
    created = {
        "id": "resp_1",
        "object": "response",
        "status": "in_progress",
        "model": "gpt-5-codex",
    }
    created |= {"output": [], "usage": None}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    done = {**created, "status": final.split(".")[1], "usage": RESPONSES_USAGE_WIRE}
    return sse(
        ("response.created", {"type": "response.created", "response": created}),
        ("response.in_progress", {"type": "response.in_progress", "response": created}),
        ("response.output_item.added", {"type": "response.output_item.added", "item": item}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Hi"}),
        ("response.output_item.done", {"type": "response.output_item.done", "item": item}),
        (final, {"type": final, "response": done}),
    )


RESPONSES_USAGE = Usage(904, 300, 4096, 0, "gpt-5-codex")

RESPONSES_BODY = json.dumps(
    {
        "id": "resp_2",
        "object": "response",
        "status": "completed",
        "model": "gpt-4.1-mini-2025-04-14",
        "output": [],
        "usage": {
            "input_tokens": 80,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 9,
        },
    }
).encode()


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-4o-mini-2024-07-18",
    } | {
        "choices": [choice],
        "usage": None,
    }


CHAT_STREAM = sse(
    (None, chat_chunk({"role": "assistant", "content": ""})),
    (None, chat_chunk({"content": "Hello"})),
    (None, chat_chunk({}, "stop")),
    (
        None,
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [],
            "usage": {
                "prompt_tokens": 1500,
                "completion_tokens": 42,
                "total_tokens": 1542,
                "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
        },
    ),
    (None, "[DONE]"),
    (None, {"choices": [], "usage": {"prompt_tokens": 9999, "completion_tokens": 9999}}),
)
CHAT_STREAM_USAGE = Usage(476, 42, 1024, 0, "gpt-4o-mini-2024-07-18")

CHAT_BODY = json.dumps(
    {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "model": "qwen3-coder",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 33, "completion_tokens": 4, "prompt_tokens_details": None},
    }
).encode()

CASES = [
    pytest.param(
        Wire.ANTHROPIC, True, ANTHROPIC_STREAM, ANTHROPIC_STREAM_USAGE, id="anthropic-sse"
    ),
    pytest.param(
        Wire.ANTHROPIC,
        False,
        ANTHROPIC_BODY,
        Usage(12, 6, 7, 40, "claude-haiku-4-5-20251001"),
        id="anthropic-json",
    ),
    pytest.param(Wire.RESPONSES, True, responses_stream(), RESPONSES_USAGE, id="responses-sse"),
    pytest.param(
        Wire.RESPONSES,
        False,
        RESPONSES_BODY,
        Usage(80, 9, 0, 0, "gpt-4.1-mini-2025-04-14"),
        id="responses-json",
    ),
    pytest.param(Wire.CHAT, True, CHAT_STREAM, CHAT_STREAM_USAGE, id="chat-sse"),
    pytest.param(Wire.CHAT, False, CHAT_BODY, Usage(33, 4, 0, 0, "qwen3-coder"), id="chat-json"),
]


@pytest.mark.parametrize("feed", FEEDS)
@pytest.mark.parametrize(("wire", "streaming", "body", "expected"), CASES)
def test_usage_is_read_exactly_however_the_body_is_chunked(
    wire: Wire, streaming: bool, body: bytes, expected: Usage, feed: Feed
) -> None:
    assert read(wire, streaming, body, feed) == expected


@pytest.mark.parametrize("feed", FEEDS)
@pytest.mark.parametrize(("wire", "streaming", "body", "expected"), CASES)
def test_crlf_line_endings_read_the_same(
    wire: Wire, streaming: bool, body: bytes, expected: Usage, feed: Feed
) -> None:
    assert read(wire, streaming, body.replace(b"\n", b"\r\n"), feed) == expected


@pytest.mark.parametrize("final", ["response.incomplete", "response.failed"])
def test_responses_usage_is_also_read_from_incomplete_and_failed_responses(final: str) -> None:
    assert read(Wire.RESPONSES, True, responses_stream(final)) == RESPONSES_USAGE


def test_anthropic_message_delta_input_and_cache_fields_win_when_present() -> None:
    late = {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use"},
        "usage": {
            "input_tokens": 2100,
            "cache_creation_input_tokens": None,  # null in a delta: unchanged
            "cache_read_input_tokens": 30500,
            "output_tokens": 77,
        },
    }
    body = ANTHROPIC_STREAM.replace(
        b"event: message_stop",
        b"event: message_delta\ndata: " + json.dumps(late).encode() + b"\n\nevent: message_stop",
    )
    assert read(Wire.ANTHROPIC, True, body) == Usage(
        2100, 77, 30500, 1200, "claude-sonnet-4-5-20250929"
    )


def test_nulls_and_missing_fields_count_as_zero() -> None:
    anthropic = {
        "type": "message",
        "model": "m",
        "usage": {"input_tokens": 5, "cache_read_input_tokens": None},
    }
    assert read(Wire.ANTHROPIC, False, json.dumps(anthropic).encode()) == Usage(5, 0, 0, 0, "m")
    responses = {
        "model": "m",
        "usage": {"input_tokens": None, "input_tokens_details": None, "output_tokens": 3},
    }
    assert read(Wire.RESPONSES, False, json.dumps(responses).encode()) == Usage(0, 3, 0, 0, "m")
    chat_stream = sse(
        (None, {"model": None, "choices": [], "usage": {"prompt_tokens": 8}}), (None, "[DONE]")
    )
    assert read(Wire.CHAT, True, chat_stream) == Usage(8, 0, 0, 0, None)


def test_no_usage_means_none() -> None:
    assert (
        read(Wire.CHAT, True, sse((None, chat_chunk({"content": "hi"})), (None, "[DONE]"))) is None
    )
    assert read(Wire.CHAT, False, b'{"model": "m", "usage": null}') is None
    assert (
        read(Wire.ANTHROPIC, False, b'{"type": "error", "error": {"type": "overloaded_error"}}')
        is None
    )
    assert read(Wire.RESPONSES, False, b"not json at all") is None
    assert read(Wire.ANTHROPIC, True, b"") is None


@pytest.mark.parametrize("wire", [Wire.COUNT_TOKENS, Wire.OTHER])
def test_unbilled_and_unknown_wires_report_no_usage(wire: Wire) -> None:
    assert read(wire, False, b'{"input_tokens": 100, "usage": {"input_tokens": 1}}') is None
    assert read(wire, True, ANTHROPIC_STREAM) is None


@pytest.mark.parametrize("feed", FEEDS)
def test_an_event_split_over_several_data_lines_is_joined(feed: Feed) -> None:
    body = (
        b"event: message_start\n"
        b'data: {"type": "message_start", "message": {"model": "m",\n'
        b'data: "usage": {"input_tokens": 3, "output_tokens": 1}}}\n'
        b"\n"
        b'data: {"type": "message_delta", "usage": {"output_tokens": 4}}\n\n'
    )
    assert read(Wire.ANTHROPIC, True, body, feed) == Usage(3, 4, 0, 0, "m")


def test_a_stream_cut_before_its_last_blank_line_still_counts() -> None:
    body = ANTHROPIC_STREAM.rstrip(b"\n").split(b"event: message_stop")[0].rstrip(b"\n")
    assert read(Wire.ANTHROPIC, True, body) == ANTHROPIC_STREAM_USAGE


def test_an_oversize_line_is_skipped_without_memory_growing() -> None:
    start, rest = ANTHROPIC_STREAM.split(b"event: content_block_start", 1)
    reader = UsageReader(Wire.ANTHROPIC, streaming=True)
    reader.feed(start)
    piece = b"x" * 65536
    tracemalloc.start()
    try:
        reader.feed(b"event: content_block_delta\ndata: ")
        for _ in range(64 * 1024 * 1024 // len(piece)):  # one 64 MiB line
            reader.feed(piece)
        reader.feed(b"\n\n")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_EVENT_BYTES
    reader.feed(b"event: content_block_start" + rest)
    assert reader.result() == ANTHROPIC_STREAM_USAGE


def test_an_oversize_final_responses_event_is_read_wherever_its_usage_sits() -> None:
    """A final event past MAX_EVENT_BYTES is scanned as it passes, not skipped: its usage is
    read before or after the long output, and a nested `usage` inside the output is not it."""
    usage = {"input_tokens": 1, "output_tokens": 9999, "input_tokens_details": {"cached_tokens": 0}}
    output = [{"type": "message", "content": [{"text": 'say "usage" ' * 100_000}]}]
    output.append({"type": "tool", "usage": {"input_tokens": 5, "output_tokens": 5}})
    for response in (
        {"model": "big", "output": output, "usage": usage},
        {"usage": usage, "output": output, "model": "big"},
    ):
        event = json.dumps({"type": "response.completed", "response": response}).encode()
        assert len(event) > MAX_EVENT_BYTES
        body = responses_stream() + b"event: response.completed\ndata: " + event + b"\n\n"
        assert read(Wire.RESPONSES, True, body, random_chunks) == Usage(1, 9999, 0, 0, "big")


def test_an_oversize_event_that_is_not_final_is_not_read() -> None:
    usage = {"input_tokens": 1, "output_tokens": 9999}
    huge = {"type": "response.output_item.done", "item": {"text": "x" * (MAX_EVENT_BYTES + 10)}}
    huge["response"] = {"usage": usage}
    body = responses_stream() + b"data: " + json.dumps(huge).encode() + b"\n\n"
    assert read(Wire.RESPONSES, True, body, random_chunks) == RESPONSES_USAGE


def test_an_oversize_final_event_is_scanned_without_memory_growing() -> None:
    reader = UsageReader(Wire.RESPONSES, streaming=True)
    reader.feed(responses_stream().split(b"event: response.completed")[0])
    piece = b"x" * 65536
    usage = json.dumps({"response": {"usage": {"input_tokens": 7, "output_tokens": 3}}})
    tracemalloc.start()
    try:
        reader.feed(b'event: response.completed\ndata: {"type": "response.completed", "pad": "')
        for _ in range(64 * 1024 * 1024 // len(piece)):  # one 64 MiB event
            reader.feed(piece)
        reader.feed(b'", ' + usage[1:].encode() + b"\n\n")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_EVENT_BYTES
    assert reader.result() == Usage(7, 3, 0, 0, None)


@pytest.mark.parametrize("feed", FEEDS[::2])
def test_anthropic_and_chat_usage_is_read_from_the_streams_end(feed: Feed) -> None:
    """Past `message_start`, an Anthropic stream is kept only by its last TAIL_BYTES (a Chat
    stream from its start), read when it ends: its final usage is there."""
    filler = b"event: content_block_delta\ndata: " + b"x" * 4000 + b"\n\n"
    body = ANTHROPIC_STREAM.replace(b"event: message_delta", filler * 100 + b"event: message_delta")
    assert read(Wire.ANTHROPIC, True, body, feed) == ANTHROPIC_STREAM_USAGE
    chat = CHAT_STREAM.replace(b'data: {"id"', filler * 50 + b'data: {"id"', 1)
    assert read(Wire.CHAT, True, chat, feed) == CHAT_STREAM_USAGE


def test_usage_followed_by_more_than_the_tail_is_unknown_never_misread() -> None:
    """Nothing follows Anthropic's final usage but `message_stop`; were more than TAIL_BYTES
    to, the usage is unknown (stored NULL and flagged), not taken from elsewhere."""
    padding = " " * (MAX_EVENT_BYTES + 10)
    huge = f'{{"type": "message_delta",{padding}"usage": {{"output_tokens": 9999}}}}'
    after = ANTHROPIC_STREAM.replace(
        b"event: message_stop", b"data: " + huge.encode() + b"\n\nevent: message_stop"
    )
    assert read(Wire.ANTHROPIC, True, after, random_chunks) is None
    before = ANTHROPIC_STREAM.replace(
        b"event: message_delta", b"data: " + huge.encode() + b"\n\nevent: message_delta", 1
    )
    assert read(Wire.ANTHROPIC, True, before, random_chunks) == ANTHROPIC_STREAM_USAGE


def test_a_json_body_past_the_cap_is_given_up() -> None:
    reader = UsageReader(Wire.CHAT, streaming=False)
    reader.feed(CHAT_BODY)
    blank = b" " * (1 << 20)
    for _ in range(33):
        reader.feed(blank)
    assert reader.result() is None


@pytest.mark.parametrize(
    ("wire", "request_body", "content_type", "expected"),
    [
        (Wire.ANTHROPIC, {"stream": True}, "text/event-stream; charset=utf-8", True),
        (Wire.ANTHROPIC, {"stream": True}, "application/json", False),  # an error answer
        (Wire.RESPONSES, {}, "text/event-stream", True),
        (Wire.CHAT, {"stream": True}, "", True),
        (Wire.CHAT, {"stream": False}, "", False),
        (Wire.CHAT, {}, "application/problem+json", False),
        (Wire.COUNT_TOKENS, {"stream": True}, "text/event-stream", False),
    ],
)
def test_is_streaming_trusts_the_content_type_then_the_request(
    wire: Wire, request_body: dict[str, object], content_type: str, expected: bool
) -> None:
    assert is_streaming(wire, request_body, content_type) is expected


def openai_chat_stream(*, with_usage: bool, usage_on_finish: bool = False) -> bytes:
    """A Chat stream as OpenAI writes it (compact JSON), with `include_usage` or without."""

    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
        body: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        if with_usage:
            body["usage"] = usage
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    out = chunk({"role": "assistant", "content": ""}) + chunk({"content": "hi"})
    if with_usage and usage_on_finish:
        return out + chunk({}, "stop", usage) + b"data: [DONE]\n\n"
    out += chunk({}, "stop")
    if with_usage:
        alone = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": []}
        out += b"data: " + json.dumps({**alone, "usage": usage}, separators=(",", ":")).encode()
        out += b"\n\n"
    return out + b"data: [DONE]\n\n"


@pytest.mark.parametrize("feed", FEEDS)
@pytest.mark.parametrize("usage_on_finish", [False, True])
@pytest.mark.parametrize("crlf", [False, True])
def test_the_usage_the_gateway_asked_for_is_taken_back_out_exactly(
    feed: Feed, usage_on_finish: bool, crlf: bool
) -> None:
    sent = openai_chat_stream(with_usage=True, usage_on_finish=usage_on_finish)
    wanted = openai_chat_stream(with_usage=False)
    if crlf:
        sent, wanted = (s.replace(b"\n", b"\r\n") for s in (sent, wanted))
    added = AddedUsageFilter()
    got = b"".join(added.feed(chunk) for chunk in feed(sent)) + added.flush()
    assert got == wanted
    assert read(Wire.CHAT, True, sent, feed) == Usage(9, 2, 0, 0, "m")


@pytest.mark.parametrize("feed", FEEDS)
def test_usage_null_is_taken_out_of_a_stream_that_opens_with_a_comment(feed: Feed) -> None:
    sent = b": keep-alive\n\n" + openai_chat_stream(with_usage=True)
    wanted = b": keep-alive\n\n" + openai_chat_stream(with_usage=False)
    added = AddedUsageFilter()
    assert b"".join(added.feed(chunk) for chunk in feed(sent)) + added.flush() == wanted


@pytest.mark.parametrize("feed", FEEDS)
def test_a_chunk_whose_usage_is_taken_out_keeps_its_other_bytes(feed: Feed) -> None:
    """Spaced JSON, UTF-8 text, usage first or last, `id:`/`event:` lines: only the usage and
    its comma go."""
    usage = '"usage": {"prompt_tokens": 9, "completion_tokens": 2}'
    choices = '"choices": [{"delta": {"content": "café ✓"}, "finish_reason": "stop"}]'
    for body, kept in (
        (f'{{"id": "c", {choices}, {usage}}}', f'{{"id": "c", {choices}}}'),
        (f'{{{usage}, "id": "c", {choices}}}', f'{{"id": "c", {choices}}}'),
    ):
        sent = f"id: 7\nevent: chunk\ndata: {body}\n\ndata: [DONE]\n\n".encode()
        wanted = f"id: 7\nevent: chunk\ndata: {kept}\n\ndata: [DONE]\n\n".encode()
        added = AddedUsageFilter()
        assert b"".join(added.feed(chunk) for chunk in feed(sent)) + added.flush() == wanted


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model": "m", "stream": true}', {"include_usage": True}),
        (b'  {"stream":true}', {"include_usage": True}),
        (b'{"stream": true, "stream_options": {"include_usage": false, "x": 1}}', None),
        (b'{"stream": true, "stream_options": null}', {"include_usage": True}),
        (b'{"stream": true, "stream_options": {}}', {"include_usage": True}),
        (b'{"stream_options": null, "stream": true, "t": "\xc3\xa9"}', {"include_usage": True}),
        (b'{"stream": true, "stream_options": {"include_usage": true}}', "unchanged"),
        (b'{"stream": false}', "unchanged"),
        (b'{"model": "m"}', "unchanged"),
    ],
)
def test_a_streamed_chat_request_is_made_to_ask_for_usage(
    body: bytes, expected: dict[str, bool] | str | None
) -> None:
    data = json.loads(body)
    asked = with_usage_asked(body, data)
    if expected == "unchanged":
        assert asked is None
        return
    assert asked is not None
    sent = json.loads(asked)
    assert sent["stream_options"] == (expected or {"include_usage": True, "x": 1})
    assert {k: v for k, v in sent.items() if k != "stream_options"} == {
        k: v for k, v in data.items() if k != "stream_options"
    }
