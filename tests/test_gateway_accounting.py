"""Every call counted or flagged, every refusal answered and recorded: the gateway on loopback
against the loopback upstream (which reports known usage), rows read back from real SQLite.

A streamed Chat call gets usage whether its client asked or not, and the client gets exactly the
bytes it would have had from the upstream; a call whose usage could not be read (a stream cut
on any wire, a client that hung up, an upstream that sends no usage) is stored with NULL tokens
and cost, and reports flag it; a client's hang-up is the client's, an upstream's failure the
upstream's; bodies over 64 MiB, bad tokens and paths outside a trial are refused in the
provider's format and recorded."""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest
import requests

from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.execute.gateway.server import MAX_REQUEST_BYTES, Gateway
from pytest_hemra.report.formats import render
from pytest_hemra.report.tables import build_report
from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS, ModelApi
from pytest_hemra.store import Store
from tests.records import trial_result
from tests.upstream import CHAT_MODEL, MODEL, OPENAI_USAGE, USAGE, Upstream

KEY = "sk-accounting-3f9a7c2e51"
CHAT = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
MESSAGES = {"model": MODEL, "max_tokens": 5, "stream": True}
MESSAGES |= {"messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": CHAT_MODEL, "input": "hi", "stream": True}
# gpt-4.1 per million tokens: 2.0 input, 0.5 cached input, 8.0 output (genai-prices)
CHAT_COST = (
    (OPENAI_USAGE["input"] - OPENAI_USAGE["cached"]) * 2.0
    + OPENAI_USAGE["cached"] * 0.5
    + OPENAI_USAGE["output"] * 8.0
) / 1e6


def stored_usage(store: Store) -> list[tuple[Any, ...]]:
    """Each call's tokens and cost exactly as SQLite holds them (NULL is None)."""
    with sqlite3.connect(store.path) as db:
        return db.execute(
            "SELECT input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost"
            " FROM calls ORDER BY id"
        ).fetchall()


def post(url: str, token: str, body: dict[str, Any], **headers: str) -> requests.Response:
    auth = {"Authorization": f"Bearer {token}", "x-api-key": token}
    return requests.post(url, json=body, headers={**auth, **headers}, stream=True, timeout=30)


def streamed(response: requests.Response) -> bytes:
    return b"".join(response.iter_content(chunk_size=None))


def events(raw: bytes) -> list[Any]:
    found = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            found.append(json.loads(line[6:]))
    return found


@pytest.fixture
def chat(gateway: Gateway) -> Iterator[tuple[str, str]]:
    """A trial's chat completions URL through the gateway, and its token."""
    access = gateway.open_trial("r.1", "r", keys={"openai": KEY, "anthropic": KEY})
    yield f"{access.base_url('127.0.0.1')}/v1/chat/completions", access.token
    gateway.close_trial(access.token)


@pytest.mark.parametrize("mode", ["", "usage-on-finish"])
def test_a_chat_stream_without_include_usage_is_counted_and_its_client_gets_what_it_asked(
    gateway: Gateway,
    store: Store,
    upstream: Upstream,
    chat: tuple[str, str],
    mode: str,
) -> None:
    url, token = chat
    through = streamed(post(url, token, CHAT, **{"x-test-mode": mode}))
    direct = streamed(post(f"{upstream.url}/v1/chat/completions", "k", CHAT))

    # the upstream was asked for usage; the client got the upstream's stream without it, byte
    # for byte: no usage-only chunk, no usage on the finishing chunk, no "usage": null
    assert upstream.seen[0]["body"]["stream_options"] == {"include_usage": True}
    assert "stream_options" not in upstream.seen[1]["body"]
    assert through == direct and b"usage" not in through
    assert (
        "".join(e["choices"][0]["delta"].get("content") or "" for e in events(through)) == "hello"
    )
    gateway.close_trial(token)
    (row,) = store.calls(run_id="r")
    assert (row.input_tokens, row.cache_read_tokens, row.output_tokens) == (15, 5, 4)
    assert row.is_usage_known and row.cost == pytest.approx(CHAT_COST)


def test_a_chat_stream_that_asks_for_usage_gets_it_unchanged(
    gateway: Gateway, store: Store, upstream: Upstream, chat: tuple[str, str]
) -> None:
    url, token = chat
    asked = {**CHAT, "stream_options": {"include_usage": True}}
    through = streamed(post(url, token, asked))
    direct = streamed(post(f"{upstream.url}/v1/chat/completions", "k", asked))
    assert through == direct
    assert events(through)[-1]["usage"]["prompt_tokens"] == OPENAI_USAGE["input"]
    assert upstream.seen[0]["body"] == asked  # sent as the client sent it
    gateway.close_trial(token)
    assert stored_usage(store) == [(15, 4, 5, 0, pytest.approx(CHAT_COST))]


@pytest.mark.parametrize(
    ("path", "body"), [("v1/messages", MESSAGES), ("v1/chat/completions", CHAT)]
)
def test_usage_cut_across_two_upstream_writes_is_counted_once_and_kept_from_the_client(
    gateway: Gateway, store: Store, upstream: Upstream, path: str, body: dict[str, Any]
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"openai": KEY, "anthropic": KEY})
    url = f"{access.base_url('127.0.0.1')}/{path}"
    through = streamed(post(url, access.token, body, **{"x-test-mode": "split-usage"}))
    direct = streamed(post(f"{upstream.url}/{path}", "k", body, **{"x-test-mode": "split-usage"}))
    gateway.close_trial(access.token)
    assert through == direct  # chat: the usage chunk the gateway asked for taken out whole
    (row,) = stored_usage(store)
    if path == "v1/messages":
        tokens = ("input_tokens", "output_tokens", "cache_read", "cache_write")
        assert row[:4] == tuple(USAGE[name] for name in tokens)
    else:
        assert b"usage" not in through
        assert row == (15, 4, 5, 0, pytest.approx(CHAT_COST))


def test_an_upstream_that_sends_no_usage_is_stored_unknown_never_zero(
    gateway: Gateway, store: Store, chat: tuple[str, str]
) -> None:
    url, token = chat
    assert b"[DONE]" in streamed(post(url, token, CHAT, **{"x-test-mode": "no-usage"}))
    plain = requests.post(url, json={**CHAT, "stream": False}, headers={"x-api-key": token})
    assert plain.status_code == 200
    gateway.close_trial(token)
    unknown, known = store.calls(run_id="r")
    assert stored_usage(store) == [(None,) * 5, (15, 4, 5, 0, pytest.approx(CHAT_COST))]
    assert not unknown.is_usage_known and unknown.error is None and unknown.status == 200
    assert known.is_usage_known


@pytest.mark.parametrize(
    ("path", "body"),
    [("v1/messages", MESSAGES), ("v1/chat/completions", CHAT), ("v1/responses", RESPONSES)],
    ids=["anthropic", "chat", "responses"],
)
def test_a_stream_the_upstream_cuts_is_the_upstreams_failure_and_its_usage_unknown(
    gateway: Gateway, store: Store, path: str, body: dict[str, Any]
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"openai": KEY, "anthropic": KEY})
    url = f"{access.base_url('127.0.0.1')}/{path}"
    response = post(url, access.token, body, **{"x-test-mode": "reset"})
    assert response.status_code == 200
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        streamed(response)  # the harness sees the reset, as it would from the provider
    totals = gateway.close_trial(access.token)
    (row,) = store.calls(run_id="r")
    assert row.status == 200 and (row.error or "").startswith("upstream failed mid-response")
    # Anthropic's message_start said 11 input tokens before the cut: a partial count is not
    # the call's usage, so it is not stored as if it were
    assert stored_usage(store) == [(None,) * 5]
    assert (totals.calls, totals.usage_unknown, totals.known_cost) == (1, 1, None)


def test_a_plain_answer_the_upstream_cuts_is_a_502_in_the_providers_format_and_unknown(
    gateway: Gateway, store: Store
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": KEY})
    url = f"{access.base_url('127.0.0.1')}/v1/messages"
    response = post(url, access.token, {**MESSAGES, "stream": False}, **{"x-test-mode": "reset"})
    assert response.status_code == 502, response.text
    assert response.json()["type"] == "error"  # Anthropic's error shape, not aiohttp's text
    totals = gateway.close_trial(access.token)
    (row,) = store.calls(run_id="r")
    assert (row.error or "").startswith("upstream failed mid-response"), row.error
    assert stored_usage(store) == [(None,) * 5] and totals.usage_unknown == 1


def test_a_cookie_an_upstream_sets_never_reaches_another_call(
    upstream: Upstream, store: Store
) -> None:
    # by host name: a cookie jar keeps no cookie for an IP address, a provider's edge is a name
    at = upstream.url.replace("127.0.0.1", "localhost")
    providers = {"anthropic": ModelApi(name="anthropic", base_url=at, auth="x-api-key")}
    with Gateway({**BUILTIN_UPSTREAMS, **providers}, store.record_call) as gateway:
        first = gateway.open_trial("r.1", "r", keys={"anthropic": KEY})
        second = gateway.open_trial("r.2", "r", keys={"anthropic": KEY})
        plain = {**MESSAGES, "stream": False}
        for access, mode in ((first, "set-cookie"), (second, ""), (first, "")):
            url = f"{access.base_url('127.0.0.1')}/v1/messages"
            answer = post(url, access.token, plain, **{"x-test-mode": mode})
            assert answer.status_code == 200, answer.text
            if mode == "set-cookie":  # the harness gets the cookie, as from the provider
                assert "__cf_bm" in answer.headers.get("Set-Cookie", "")
    # the gateway kept none to send on: not to another trial, nor to the same one
    assert [call["headers"].get("Cookie") for call in upstream.seen] == [None, None, None]


def test_a_plain_answer_leaves_whole_with_its_length_and_the_key_scrubbed(
    gateway: Gateway, store: Store
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": KEY})
    url = f"{access.base_url('127.0.0.1')}/v1/messages"
    plain = post(url, access.token, {**MESSAGES, "stream": False})
    echoed = post(url, access.token, {**MESSAGES, "stream": False}, **{"x-test-mode": "echo-key"})
    for response in (plain, echoed):  # one write, its length declared: not chunked
        assert "Transfer-Encoding" not in response.headers
        assert response.headers["Content-Length"] == str(len(response.content))
    assert plain.json()["content"][0]["text"] == "hello"
    assert KEY not in echoed.text and "[redacted]" in echoed.text
    assert KEY not in echoed.headers["x-echo"]
    gateway.close_trial(access.token)
    # the answer is read for usage as before; a refusal (401) bills nothing
    assert [row.input_tokens for row in store.calls(run_id="r")] == [USAGE["input_tokens"], 0]


@pytest.mark.parametrize(
    ("path", "body"),
    [("v1/messages", MESSAGES), ("v1/chat/completions", CHAT)],
    ids=["anthropic", "chat"],
)
def test_a_client_that_hangs_up_is_recorded_as_the_clients(
    gateway: Gateway, store: Store, path: str, body: dict[str, Any]
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"openai": KEY, "anthropic": KEY})
    host, port = access.base_url("127.0.0.1").removeprefix("http://").split("/")[0].split(":")
    payload = json.dumps(body).encode()
    request = (
        f"POST /t/{access.token}/{path} HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        f"x-api-key: {access.token}\r\nx-test-mode: drip\r\nx-test-chunks: 50\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as client:
        client.sendall(request + payload)
        assert client.recv(65536).startswith(b"HTTP/1.1 200")  # the stream has begun
    started = time.monotonic()
    totals = gateway.close_trial(access.token)
    (row,) = store.calls(run_id="r")
    assert (row.error or "").startswith("client hung up mid-response"), row.error
    assert "upstream" not in (row.error or "")
    assert stored_usage(store) == [(None,) * 5] and totals.usage_unknown == 1
    # the upstream's answer was abandoned at the next chunk, not read to its end (10 s of drip)
    assert time.monotonic() - started < 5


def test_a_client_that_hangs_up_while_sending_is_recorded_as_the_clients(
    gateway: Gateway, store: Store, upstream: Upstream
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": KEY})
    host, port = access.base_url("127.0.0.1").removeprefix("http://").split("/")[0].split(":")
    request = (
        f"POST /t/{access.token}/v1/messages HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Length: 100000\r\nx-api-key: {access.token}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as client:
        client.sendall(request + b'{"model": ')
        time.sleep(0.2)  # the gateway is reading the body when the client goes
    gateway.close_trial(access.token)
    (row,) = store.calls(run_id="r")
    assert (row.status, row.refused) == (499, False)
    assert (row.error or "").startswith("client hung up mid-request")
    assert stored_usage(store) == [(0, 0, 0, 0, 0.0)]  # never forwarded: known to cost nothing
    assert upstream.seen == []


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    ("path", "kind"),
    [("v1/messages", "request_too_large"), ("v1/chat/completions", "invalid_request_error")],
    ids=["anthropic", "chat"],
)
def test_a_body_over_64_mib_is_refused_in_the_providers_format_and_recorded(
    gateway: Gateway, store: Store, upstream: Upstream, path: str, kind: str, chunked: bool
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"openai": KEY, "anthropic": KEY})
    size = 70 * 1000 * 1000
    piece = b"x" * (1 << 20)

    def body() -> Iterator[bytes]:
        sent = 0
        while sent < size:
            yield piece
            sent += len(piece)

    response = requests.post(
        f"{access.base_url('127.0.0.1')}/{path}",
        data=body() if chunked else piece * (size // len(piece)),
        headers={"x-api-key": access.token, "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["type"] == kind and "64 MiB" in error["message"]
    gateway.close_trial(access.token)
    (row,) = store.calls(run_id="r")
    assert (row.status, row.refused, row.trial_id) == (413, True, "r.1")
    assert (row.error or "").startswith("refused: the request body")
    assert row.request_bytes == 0 and upstream.seen == []  # never read whole, never forwarded
    assert MAX_REQUEST_BYTES == 64 << 20


def test_a_request_outside_every_trial_is_refused_in_the_providers_format_and_recorded(
    gateway: Gateway, store: Store, upstream: Upstream
) -> None:
    url = gateway.base_urls["127.0.0.1"]
    anthropic = requests.post(
        f"{url}/v1/messages", json=MESSAGES, headers={"anthropic-version": "2023-06-01"}
    )
    openai = requests.post(f"{url}/v1/chat/completions", json=CHAT)
    assert (anthropic.status_code, openai.status_code) == (404, 404)
    assert anthropic.json()["error"]["type"] == "not_found_error"
    assert "/t/<token>/" in openai.json()["error"]["message"]
    deadline = time.monotonic() + 30  # rows are written by the gateway's writer thread
    while len(rows := store.calls()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(r.refused, r.trial_id, r.status, r.path) for r in rows] == [
        (True, None, 404, "/v1/messages"),
        (True, None, 404, "/v1/chat/completions"),
    ]
    assert {r.error for r in rows} == {"refused: no trial token in the path"}
    assert upstream.seen == []


def test_reports_flag_the_share_of_calls_of_unknown_usage_and_the_cost_unknown(
    gateway: Gateway, store: Store, tmp_path: Any
) -> None:
    access = gateway.open_trial("run.00000", "run", keys={"anthropic": KEY})
    url = f"{access.base_url('127.0.0.1')}/v1/messages"
    for mode in ("", "", "reset"):
        response = post(url, access.token, MESSAGES, **{"x-test-mode": mode})
        with contextlib.suppress(requests.exceptions.ChunkedEncodingError):
            streamed(response)
    totals = gateway.close_trial(access.token)
    per_call = sum(USAGE.values())
    assert (totals.calls, totals.usage_unknown, totals.total_tokens) == (3, 1, 2 * per_call)
    assert totals.cost is not None and totals.cost > 0 and totals.known_cost is None
    spec = {
        "spec": {"harnesses": ["h"], "baseline": "h", "model": MODEL, "attempts": 1},
        "datasets": {"ds": {"digest": "d" * 64, "path": "/ds", "tasks": ["t"]}},
        "harnesses": {"h": {"digest": "h" * 64}},
    }
    store.record_plan("run", "run", spec, tmp_path, [PlannedTrial("ds", "t", "h", 1)])
    (trial,) = store.trials("run")
    assert trial.id == "run.00000"
    result = {
        "outcome": "pass", "reward": 1.0, "rewards": {"reward": 1.0}, "exit_code": 0,
        "error": None, "finished_at": 1.0, "duration": 2.0, "phases": {}, "trial_dir": "x",
        "usage": asdict(totals),
    }  # fmt: skip
    store.finish_trial(trial.id, trial_result(result))
    (trial,) = store.trials("run")
    assert (trial.calls, trial.usage_unknown, trial.cost, trial.is_priced) == (3, 1, None, True)
    text = render(build_report(store, "run"), "text")
    assert "! h: usage unknown on 1 of 3 model calls (33.3%, in 1 trial)" in text
    assert "no price for" not in text  # the price is known: it is the usage that is not
    assert "unknown" in text.split("\n! ")[0]  # the cost column
