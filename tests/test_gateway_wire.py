"""The client gets the provider's bytes: a real gateway on loopback against the loopback
upstream speaking the providers' wires the ways real ones do (compressed although asked for
`identity`, `stream_options: null`, a comment before the first event and waits between events,
non-ASCII text and `id:`/`event:` lines in a chunk whose usage is taken out, a 2 MiB final
Responses event, an error event mid-stream, a client that hangs up). Each test compares what the
client receives through the gateway with a direct call to the same upstream, byte for byte,
except what HEMRA added and took back out, and the recorded tokens with the upstream's."""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import urllib3

from pytest_hemra.execute.gateway.calls import CLIENT_GONE, PARTIAL, STREAM_ERROR
from pytest_hemra.execute.gateway.encoding import PIECE_BYTES, Decoder
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.gateway.usage import MAX_EVENT_BYTES
from pytest_hemra.store import Store
from tests.test_gateway_accounting import stored_usage
from tests.upstream import CHAT_MODEL, MODEL, OPENAI_USAGE, USAGE, Upstream

KEY = "sk-wire-5d1e9b7a42c8"
CHAT = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
ASKED = {**CHAT, "stream_options": {"include_usage": True}}
MESSAGES = {"model": MODEL, "max_tokens": 5, "stream": True}
MESSAGES |= {"messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": CHAT_MODEL, "input": "hi", "stream": True}
# what the upstream reports, as stored: input (without cache reads), output, cache read, write
ANTHROPIC_TOKENS = (
    USAGE["input_tokens"],
    USAGE["output_tokens"],
    USAGE["cache_read"],
    USAGE["cache_write"],
)
OPENAI_TOKENS = (
    OPENAI_USAGE["input"] - OPENAI_USAGE["cached"],
    OPENAI_USAGE["output"],
    OPENAI_USAGE["cached"],
    0,
)
GZIP = {"x-test-encoding": "gzip"}


def stored_tokens(store: Store) -> list[tuple[Any, ...]]:
    """Each call's four token counts as SQLite holds them (NULL is None)."""
    return [row[:4] for row in stored_usage(store)]


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> requests.Response:
    auth = {"Authorization": "Bearer " + headers.pop("token", "k"), "x-api-key": "k"}
    auth["x-api-key"] = auth["Authorization"][7:]
    return requests.post(url, json=body, headers={**auth, **headers}, stream=True, timeout=60)


def raw(response: requests.Response) -> bytes:
    """The body exactly as it came over the wire, not decoded."""
    return b"".join(response.raw.stream(1 << 16, decode_content=False))


@pytest.fixture
def trial(gateway: Gateway) -> Iterator[tuple[str, str]]:
    """A trial's base URL through the gateway, and its token."""
    access = gateway.open_trial("r.1", "r", keys={"openai": KEY, "anthropic": KEY})
    yield access.base_url("127.0.0.1"), access.token
    gateway.close_trial(access.token)


def both(
    trial: tuple[str, str], upstream: Upstream, path: str, body: dict[str, Any], **headers: str
) -> tuple[requests.Response, bytes, requests.Response, bytes]:
    """The same call through the gateway and directly: each response and its raw bytes."""
    base, token = trial
    through = post(f"{base}/{path}", body, {**headers, "token": token})
    through_bytes = raw(through)
    direct = post(f"{upstream.url}/{path}", body, dict(headers))
    return through, through_bytes, direct, raw(direct)


CASES = [
    pytest.param("v1/messages", MESSAGES, ANTHROPIC_TOKENS, id="anthropic"),
    pytest.param("v1/chat/completions", ASKED, OPENAI_TOKENS, id="chat"),
    pytest.param("v1/responses", RESPONSES, OPENAI_TOKENS, id="responses"),
]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
@pytest.mark.parametrize(("path", "body", "tokens"), CASES)
def test_a_compressed_answer_reaches_the_client_as_sent_and_its_usage_is_read(
    gateway: Gateway,
    store: Store,
    upstream: Upstream,
    trial: tuple[str, str],
    path: str,
    body: dict[str, Any],
    tokens: tuple[int, ...],
    stream: bool,
) -> None:
    body = {**body, "stream": stream}
    through, got, direct, sent = both(trial, upstream, path, body, **GZIP)
    assert through.status_code == direct.status_code == 200
    assert upstream.seen[0]["headers"]["Accept-Encoding"] == "identity"  # asked, not honoured
    assert got == sent and got[:2] == b"\x1f\x8b"  # the provider's gzip bytes, untouched
    assert through.headers["Content-Encoding"] == "gzip"  # with the header that decodes them
    decoded = gzip.decompress(got)
    assert (b"data: " in decoded) is stream and (b"_tokens" in decoded)
    gateway.close_trial(trial[1])
    assert stored_tokens(store) == [tokens]


def test_a_compressed_chat_stream_whose_usage_the_gateway_asked_for_is_passed_decoded(
    gateway: Gateway, store: Store, upstream: Upstream, trial: tuple[str, str]
) -> None:
    """The usage chunk cannot be cut out of compressed bytes: the client gets the stream it
    would have had, decoded (no Content-Encoding), without what the gateway asked for."""
    through, got, _, sent = both(trial, upstream, "v1/chat/completions", CHAT, **GZIP)
    assert "Content-Encoding" not in through.headers
    assert got == gzip.decompress(sent) and b"usage" not in got
    gateway.close_trial(trial[1])
    assert stored_tokens(store) == [OPENAI_TOKENS]


@pytest.mark.parametrize(
    "options",
    [
        ...,
        None,
        {},
        {"include_usage": False},
        {"include_usage": None, "include_obfuscation": False},
    ],
    ids=["missing", "null", "empty", "false", "other-options"],
)
def test_every_spelling_of_no_usage_still_gets_usage_asked_and_the_client_none(
    gateway: Gateway,
    store: Store,
    upstream: Upstream,
    trial: tuple[str, str],
    options: Any,
) -> None:
    body = dict(CHAT) if options is ... else {**CHAT, "stream_options": options}
    _, got, _, sent = both(trial, upstream, "v1/chat/completions", body)
    asked = upstream.seen[0]["body"]
    assert asked["stream_options"]["include_usage"] is True
    if isinstance(options, dict) and "include_obfuscation" in options:
        assert asked["stream_options"]["include_obfuscation"] is False  # the client's, kept
    assert {k: v for k, v in asked.items() if k != "stream_options"} == {
        k: v for k, v in body.items() if k != "stream_options"
    }
    assert got == sent and b"usage" not in got
    gateway.close_trial(trial[1])
    assert stored_tokens(store) == [OPENAI_TOKENS]


@pytest.mark.parametrize(
    ("path", "body", "tokens"),
    [
        pytest.param("v1/chat/completions", CHAT, OPENAI_TOKENS, id="chat-usage-added"),
        *CASES,
    ],
)
def test_a_stream_that_starts_with_a_comment_and_waits_between_events_is_handled_like_any(
    gateway: Gateway,
    store: Store,
    upstream: Upstream,
    trial: tuple[str, str],
    path: str,
    body: dict[str, Any],
    tokens: tuple[int, ...],
) -> None:
    _, got, _, sent = both(trial, upstream, path, body, **{"x-test-keep-alive": "0.05"})
    assert got.startswith(b": keep-alive\n\n")
    assert got == sent  # chat: no `"usage":null` left in any chunk, no usage chunk
    gateway.close_trial(trial[1])
    assert stored_tokens(store) == [tokens]


@pytest.mark.parametrize("keep_alive", [False, True], ids=["at-once", "comment-first"])
@pytest.mark.parametrize("mode", ["usage-on-finish", ""])
def test_a_chunk_whose_usage_is_taken_out_keeps_its_other_bytes_as_sent(
    gateway: Gateway,
    store: Store,
    upstream: Upstream,
    trial: tuple[str, str],
    mode: str,
    keep_alive: bool,
) -> None:
    """Non-ASCII text stays UTF-8 (never `\\u00e9`), `id:` and `event:` lines stay, and only
    the bytes the gateway's `include_usage` added are gone."""
    quirks = {"x-test-mode": mode, "x-test-unicode": "1", "x-test-sse-fields": "1"}
    if keep_alive:
        quirks["x-test-keep-alive"] = "0.02"
    _, got, _, sent = both(trial, upstream, "v1/chat/completions", CHAT, **quirks)
    assert got == sent
    assert "café".encode() in got and b"\\u00e9" not in got and b"usage" not in got
    assert got.count(b"id: ") == got.count(b"event: chunk") == 4  # every chunk's, kept
    asked_too = both(trial, upstream, "v1/chat/completions", ASKED, **quirks)
    assert asked_too[1] == asked_too[3]  # a client that asked gets the usage, untouched
    gateway.close_trial(trial[1])
    assert stored_tokens(store) == [OPENAI_TOKENS, OPENAI_TOKENS]


def test_a_responses_final_event_of_2_mib_has_its_usage_read(
    gateway: Gateway, store: Store, upstream: Upstream, trial: tuple[str, str]
) -> None:
    size = {"x-test-final-bytes": str(2 << 20)}
    _, got, _, sent = both(trial, upstream, "v1/responses", RESPONSES, **size)
    final = got[got.rindex(b"event: response.completed") :]
    assert len(final) > 2 << 20 > MAX_EVENT_BYTES
    assert got == sent
    gateway.close_trial(trial[1])
    assert stored_tokens(store) == [OPENAI_TOKENS]


def test_an_anthropic_error_event_mid_stream_is_recorded_with_its_text(
    gateway: Gateway, store: Store, upstream: Upstream, trial: tuple[str, str]
) -> None:
    mode = {"x-test-mode": "error-event"}
    _, got, _, sent = both(trial, upstream, "v1/messages", MESSAGES, **mode)
    assert got == sent and b"event: error" in got
    gateway.close_trial(trial[1])
    (row,) = store.calls(run_id="r")
    assert f"{STREAM_ERROR}: overloaded_error: Overloaded" in (row.error or "")
    # no final count came: unknown (NULL), what message_start said kept and flagged partial
    assert stored_tokens(store) == [(None,) * 4] and not row.is_usage_known
    assert _partial_counts(row.error) == _message_start_counts()
    assert row.model == MODEL


def test_a_client_that_hangs_up_after_message_start_keeps_its_input_counts_flagged_partial(
    gateway: Gateway, store: Store, upstream: Upstream, trial: tuple[str, str]
) -> None:
    base, token = trial
    drip = {"x-test-mode": "drip", "x-test-chunks": "10"}
    host, port = base.removeprefix("http://").split("/")[0].split(":")
    payload = json.dumps(MESSAGES).encode()
    request = (
        f"POST /t/{token}/v1/messages HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        f"x-api-key: {token}\r\nx-test-mode: drip\r\nx-test-chunks: 10\r\n\r\n"
    ).encode()
    received = b""
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(request + payload)
        while b"content_block_delta" not in received:  # message_start, then the first delta
            piece = client.recv(65536)
            assert piece, received
            received += piece
    # the client is gone, mid-stream; what it got, its chunked framing taken off
    got = _dechunked(received.split(b"\r\n\r\n", 1)[1])
    direct = raw(post(f"{upstream.url}/v1/messages", MESSAGES, dict(drip)))
    assert direct.startswith(got) and b"message_start" in got
    gateway.close_trial(token)
    (row,) = store.calls(run_id="r")
    assert (row.error or "").startswith(CLIENT_GONE)
    assert stored_tokens(store) == [(None,) * 4] and not row.is_usage_known
    assert _partial_counts(row.error) == _message_start_counts()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
def test_a_compressed_answer_that_echoes_the_key_never_passes_it(
    gateway: Gateway, store: Store, trial: tuple[str, str], stream: bool
) -> None:
    base, token = trial
    echo = {"x-test-mode": "echo-key", **GZIP, "token": token}
    got, headers = b"", {}
    try:
        response = post(f"{base}/v1/messages", {**MESSAGES, "stream": stream}, echo)
        headers = dict(response.headers)
        for piece in response.raw.stream(1 << 16, decode_content=False):
            got += piece
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError):
        assert stream  # a stream is cut before the chunk holding the key (or its headers)
    if stream:
        decoded = zlib.decompressobj(31).decompress(got) if got else b""
    else:
        assert "Content-Encoding" not in headers  # decoded, scrubbed
        decoded = got
    assert KEY.encode() not in decoded and KEY not in headers.get("x-echo", "")
    gateway.close_trial(token)
    (row,) = store.calls(run_id="r")
    if stream:
        assert "echoed a key in a compressed answer" in (row.error or "")
    else:
        assert b"[redacted]" in decoded


@pytest.mark.parametrize(
    ("coding", "compress"),
    [
        ("gzip", lambda data: gzip.compress(data[:5]) + gzip.compress(data[5:])),  # two members
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some servers send
    ],
    ids=["gzip-members", "deflate-zlib", "deflate-raw"],
)
def test_a_compressed_body_is_decoded_a_bounded_piece_at_a_time(coding: str, compress: Any) -> None:
    data = b"usage " + b"\0" * (16 << 20)  # a few KiB that inflate to 16 MiB
    blob = compress(data)
    decoder = Decoder(coding)
    pieces = [
        piece for at in range(0, len(blob), 999) for piece in decoder.feed(blob[at : at + 999])
    ]
    pieces.append(decoder.flush())
    assert max(len(piece) for piece in pieces) <= PIECE_BYTES
    assert b"".join(pieces) == data and not decoder.is_broken


def _message_start_counts() -> dict[str, int]:
    return {
        "input_tokens": USAGE["input_tokens"],
        "cache_read_tokens": USAGE["cache_read"],
        "cache_write_tokens": USAGE["cache_write"],
    }


def _partial_counts(error: str | None) -> dict[str, int]:
    """The counts a row's error flags as partial."""
    text = (error or "").split(f"{PARTIAL} ", 1)[1]
    counts = text.split(": ", 1)[1].split(",", 1)[0]
    return {name: int(value) for name, value in (pair.split("=") for pair in counts.split())}


def _dechunked(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body's data, as far as it was received."""
    data, at = b"", 0
    while True:
        line_end = body.find(b"\r\n", at)
        if line_end < 0:
            return data
        size = int(body[at:line_end], 16)
        data += body[line_end + 2 : line_end + 2 + size]
        at = line_end + 2 + size + 2
        if size == 0 or at > len(body):
            return data
