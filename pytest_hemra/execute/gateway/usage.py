"""Token usage read from a model response as it streams through the gateway.

The gateway forwards every chunk untouched and feeds a copy to a `UsageReader`, which keeps only
what it needs: memory stays bounded whatever the response size, and only the few SSE events that
can carry usage are JSON-decoded (a content delta never is).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pytest_hemra.execute.gateway.wire import CallUsage, Wire

MAX_LINE_BYTES = 1 << 20  # an SSE line (or event's data) longer than this is skipped
MAX_BODY_BYTES = 32 << 20  # a plain JSON body longer than this is given up on
BILLED_WIRES = frozenset({Wire.ANTHROPIC, Wire.RESPONSES, Wire.CHAT})
FINAL_RESPONSE_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# `"usage": {` and not `"usage": null`: OpenAI streams repeat a null usage on every event or chunk
CARRIES_USAGE = re.compile(rb'"usage"\s*:\s*\{')


class UsageReader:
    """Reads a response body as it streams past (SSE or plain JSON) and finds its token usage."""

    def __init__(self, wire: Wire, streaming: bool) -> None:
        self._wire = wire
        self._streaming = streaming
        self._is_billed = wire in BILLED_WIRES
        self._body = bytearray()  # plain JSON, up to MAX_BODY_BYTES
        self._is_too_big = False
        self._line = bytearray()  # the unfinished SSE line
        self._is_skipping_line = False
        self._event_data: list[bytes] = []
        self._event_size = 0
        self._is_event_broken = False
        self._is_done = False  # `data: [DONE]` seen
        self._tokens = _Tokens()

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk as forwarded; chunk boundaries may fall anywhere."""
        if not self._is_billed or not chunk:
            return
        if not self._streaming:
            self._feed_body(chunk)
            return
        start = 0
        while not self._is_done:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._keep_partial_line(chunk, start)
                return
            if self._is_skipping_line:
                self._is_skipping_line = False
                self._is_event_broken = True
            elif self._line:
                if len(self._line) + end - start > MAX_LINE_BYTES:
                    self._is_event_broken = True
                else:
                    self._line += chunk[start:end]
                    self._read_line(bytes(self._line))
                self._line.clear()
            elif end - start > MAX_LINE_BYTES:
                self._is_event_broken = True
            else:
                self._read_line(chunk[start:end])
            start = end + 1

    def result(self) -> CallUsage | None:
        """The usage found, once the last chunk is fed; None if there was none (or none billed)."""
        if not self._is_billed:
            return None
        if not self._streaming:
            return self._body_usage()
        if not self._is_done:
            if self._line and not self._is_skipping_line:
                self._read_line(bytes(self._line))
            self._line.clear()
            self._end_event()
        return self._tokens.usage()

    def _feed_body(self, chunk: bytes) -> None:
        if self._is_too_big:
            return
        if len(self._body) + len(chunk) > MAX_BODY_BYTES:
            self._is_too_big = True
            self._body = bytearray()
            return
        self._body += chunk

    def _body_usage(self) -> CallUsage | None:
        if self._is_too_big:
            return None
        body = _decode(bytes(self._body))
        if body is None:
            return None
        if self._wire is Wire.ANTHROPIC:
            self._tokens.add_anthropic(body.get("usage"), is_delta=False)
        elif self._wire is Wire.RESPONSES:
            self._tokens.set_openai(body.get("usage"), "input_tokens", "input_tokens_details")
        else:
            self._tokens.set_openai(body.get("usage"), "prompt_tokens", "prompt_tokens_details")
        self._tokens.set_model(body.get("model"))
        return self._tokens.usage()

    def _keep_partial_line(self, chunk: bytes, start: int) -> None:
        if self._is_skipping_line:
            return
        if len(self._line) + len(chunk) - start > MAX_LINE_BYTES:
            self._is_skipping_line = True
            self._line.clear()
        else:
            self._line += chunk[start:]

    def _read_line(self, line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            self._end_event()
        elif line.startswith(b"data:"):
            data = line[6:] if line.startswith(b"data: ") else line[5:]
            self._event_size += len(data) + 1
            if self._event_size > MAX_LINE_BYTES:
                self._is_event_broken = True
            if not self._is_event_broken:
                self._event_data.append(data)
        # `event:`, `id:`, `retry:` and `:` comments carry nothing usage needs: the JSON has `type`

    def _end_event(self) -> None:
        data = b"\n".join(self._event_data)
        is_broken = self._is_event_broken
        self._event_data.clear()
        self._event_size = 0
        self._is_event_broken = False
        if is_broken or not data:
            return
        if data.strip() == b"[DONE]":
            self._is_done = True
            return
        if not CARRIES_USAGE.search(data):
            return
        event = _decode(data)
        if event is not None:
            self._read_event(event)

    def _read_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if self._wire is Wire.ANTHROPIC:
            if kind == "message_start":
                message = _dict(event.get("message"))
                self._tokens.add_anthropic(message.get("usage"), is_delta=False)
                self._tokens.set_model(message.get("model"))
            elif kind == "message_delta":
                self._tokens.add_anthropic(event.get("usage"), is_delta=True)
        elif self._wire is Wire.RESPONSES:
            if kind in FINAL_RESPONSE_EVENTS:
                response = _dict(event.get("response"))
                self._tokens.set_openai(
                    response.get("usage"), "input_tokens", "input_tokens_details"
                )
                self._tokens.set_model(response.get("model"))
        elif event.get("usage") is not None:
            self._tokens.set_openai(event.get("usage"), "prompt_tokens", "prompt_tokens_details")
            self._tokens.set_model(event.get("model"))


def is_streaming(wire: Wire, request_body: dict[str, object], content_type: str) -> bool:
    """Whether a response is SSE: its content type says so; without one, the request's `stream`.

    An error answers a streaming request with plain JSON, so the content type wins when present.
    """
    if wire is Wire.COUNT_TOKENS:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "text/event-stream":
        return True
    if media == "application/json" or media.endswith("+json"):
        return False
    return request_body.get("stream") is True


class _Tokens:
    """The counts found so far, in each provider's terms until `usage()` normalizes them."""

    def __init__(self) -> None:
        self.is_found = False
        self.input = 0  # excluding cached input
        self.output = 0
        self.cache_read = 0
        self.cache_write = 0
        self.model: str | None = None

    def add_anthropic(self, usage: object, *, is_delta: bool) -> None:
        """Anthropic reports cached input apart; a `message_delta` overrides what it carries."""
        if not isinstance(usage, dict):
            return
        self.is_found = True
        fields = {
            "input": "input_tokens",
            "output": "output_tokens",
            "cache_read": "cache_read_input_tokens",
            "cache_write": "cache_creation_input_tokens",
        }
        for attribute, key in fields.items():
            # in a delta an absent or null field means "unchanged", not zero
            if not is_delta or usage.get(key) is not None:
                setattr(self, attribute, _count(usage.get(key)))

    def set_openai(self, usage: object, input_key: str, details_key: str) -> None:
        """OpenAI's input count includes `cached_tokens`: they move to cache reads here."""
        if not isinstance(usage, dict):
            return
        self.is_found = True
        cached = _count(_dict(usage.get(details_key)).get("cached_tokens"))
        self.input = max(0, _count(usage.get(input_key)) - cached)
        self.cache_read = cached
        self.cache_write = 0
        output_key = "output_tokens" if input_key == "input_tokens" else "completion_tokens"
        self.output = _count(usage.get(output_key))

    def set_model(self, model: object) -> None:
        if isinstance(model, str) and model:
            self.model = model

    def usage(self) -> CallUsage | None:
        if not self.is_found:
            return None
        return CallUsage(
            input_tokens=self.input,
            output_tokens=self.output,
            cache_read_tokens=self.cache_read,
            cache_write_tokens=self.cache_write,
            model=self.model,
        )


def _decode(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int:
    """A token count; missing, null or nonsense counts as 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value))
