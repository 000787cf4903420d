"""`hemra canary`: is the gateway counting what the upstream reports?

It starts a gateway, sends one small call per wire format (Anthropic Messages, OpenAI Responses,
Chat Completions), streamed and not, through it to the upstream, and compares the usage the
gateway recorded with the upstream's own numbers: the scripted model's documented usage
offline; with `--expect scripted` an upstream standing in for it; otherwise the usage the
upstream wrote into the response the client received, read by a parser of its own (the last
usage figures anywhere in the body), so a change of format the gateway misses shows up.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pytest_hemra.core.records import CallRow
from pytest_hemra.core.usage import Usage
from pytest_hemra.execute.gateway.scripted import scripted_usage
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.gateway.wire import Wire
from pytest_hemra.resolve.upstreams import SCRIPTED, SCRIPTED_MODEL, ModelApi

TOLERANCE = 0.0  # relative: usage is counted exactly, or the canary fails
PATHS = {
    Wire.ANTHROPIC: "v1/messages",
    Wire.RESPONSES: "v1/responses",
    Wire.CHAT: "v1/chat/completions",
}


@dataclass(frozen=True)
class Probe:
    wire: Wire
    stream: bool
    recorded: Usage
    expected: Usage | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.expected is not None
            and _agree(self.recorded, self.expected)
        )

    def describe(self) -> str:
        name = f"{self.wire.value}{' stream' if self.stream else ''}"
        if self.error:
            return f"FAIL {name}: {self.error}"
        if self.expected is None:
            return f"FAIL {name}: the upstream's response carried no usage to compare"
        verdict = "ok  " if self.ok else "FAIL"
        return (
            f"{verdict} {name}: gateway recorded {_show(self.recorded)};"
            f" upstream reported {_show(self.expected)}"
        )


def run_canary(
    provider: ModelApi,
    model: str,
    key: str | None = None,
    expect_scripted: bool = False,
    wires: tuple[Wire, ...] = tuple(PATHS),
) -> list[Probe]:
    rows: list[CallRow] = []
    gateway = Gateway({provider.name: provider}, rows.append).start()
    try:
        return [
            _probe(gateway, provider, model, key, wire, stream, expect_scripted)
            for wire in wires
            for stream in (False, True)
        ]
    finally:
        gateway.stop()


def _probe(
    gateway: Gateway,
    provider: ModelApi,
    model: str,
    key: str | None,
    wire: Wire,
    stream: bool,
    expect_scripted: bool,
) -> Probe:
    access = gateway.open_trial(
        "canary", "canary", provider=provider.name, keys={provider.name: key} if key else {}
    )
    body, error = b"", None
    try:
        body = _call(access.base_url("127.0.0.1"), access.token, wire, model, stream)
    except (OSError, ValueError) as failure:
        error = f"the call failed: {failure}"
    finally:
        usage = gateway.close_trial(access.token)
    recorded = usage.tokens
    if provider.name == SCRIPTED or expect_scripted:
        expected: Usage | None = scripted_usage(wire)
    else:
        expected = reported_usage(wire, body)
    return Probe(wire, stream, recorded, expected, error)


def _call(base_url: str, token: str, wire: Wire, model: str, stream: bool) -> bytes:
    text = "Reply with the word canary."
    if wire is Wire.ANTHROPIC:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": text}],
        }
        headers = {"x-api-key": token, "anthropic-version": "2023-06-01"}
    elif wire is Wire.RESPONSES:
        body = {"model": model, "input": text, "max_output_tokens": 16}
        headers = {"authorization": f"Bearer {token}"}
    else:
        body = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
        headers = {"authorization": f"Bearer {token}"}
    body["stream"] = stream
    request = urllib.request.Request(
        f"{base_url}/{PATHS[wire]}",
        data=json.dumps(body).encode(),
        headers={**headers, "content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as failure:
        raise ValueError(f"HTTP {failure.code}: {failure.read()[:300]!r}") from None


def reported_usage(wire: Wire, body: bytes) -> Usage | None:
    """The usage the upstream wrote into its response, read independently of the gateway:
    the last figure of each kind anywhere in the JSON body or the SSE events."""
    found: dict[str, int] = {}
    for document in _documents(body):
        for usage in _usages(document):
            for key, value in usage.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    found[key] = value
                elif isinstance(value, dict):
                    for inner, number in value.items():
                        if isinstance(number, int) and not isinstance(number, bool):
                            found[f"{key}.{inner}"] = number
    if not found:
        return None
    if wire is Wire.ANTHROPIC:
        return Usage(
            found.get("input_tokens", 0),
            found.get("output_tokens", 0),
            found.get("cache_read_input_tokens", 0),
            found.get("cache_creation_input_tokens", 0),
        )
    prompt = "input_tokens" if wire is Wire.RESPONSES else "prompt_tokens"
    output = "output_tokens" if wire is Wire.RESPONSES else "completion_tokens"
    details = "input_tokens_details" if wire is Wire.RESPONSES else "prompt_tokens_details"
    cached = found.get(f"{details}.cached_tokens", 0)
    return Usage(found.get(prompt, 0) - cached, found.get(output, 0), cached, 0)


def _documents(body: bytes) -> Iterator[Any]:
    text = body.decode(errors="replace").strip()
    if text.startswith("{"):
        try:
            yield json.loads(text)
            return
        except ValueError:
            pass
    for line in text.splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload and payload != "[DONE]":
                try:
                    yield json.loads(payload)
                except ValueError:
                    continue


def _usages(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "usage" and isinstance(value, dict):
                yield value
            else:
                yield from _usages(value)
    elif isinstance(node, list):
        for item in node:
            yield from _usages(item)


def _agree(recorded: Usage, expected: Usage) -> bool:
    pairs = zip(recorded.counts().values(), expected.counts().values(), strict=True)
    return all(abs(a - b) <= TOLERANCE * max(a, b, 1) for a, b in pairs)


def _show(usage: Usage) -> str:
    return (
        f"input {usage.input_tokens}, output {usage.output_tokens},"
        f" cache read {usage.cache_read_tokens}, cache write {usage.cache_write_tokens}"
    )


__all__ = ["SCRIPTED_MODEL", "Probe", "reported_usage", "run_canary"]
