"""Every streamed Chat Completions call carries usage, and its client still gets the stream it
asked for.

OpenAI streams Chat Completions without usage unless the request sets
`stream_options.include_usage`, and LiteLLM (under aider and mini-swe-agent) and many other
clients never set it (or send `"stream_options": null`, `{}`, `include_usage: false`): such a call
would be counted as nothing. The gateway sets it whenever the client did not (`with_usage_asked`),
and `AddedUsageFilter` takes back out of what the client receives what the option added, and only
that: the usage-only chunk before `[DONE]` (the whole event), the `usage` of a chunk that also
carries choices (where a compatible server puts it there: the key and its value cut out of the
chunk's bytes, the rest of the chunk as the provider sent it), and the `"usage":null` that every
other chunk then carries (spelled as this upstream spells it, learnt from the first chunk that
has it). No event is re-encoded: `event:` and `id:` lines, non-ASCII text and the provider's
spacing stay as they came. The gateway reads the usage from the stream as the upstream sent it,
before this filter.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pytest_hemra.execute.gateway.sse import (
    event_data,
    event_start,
    last_boundary_after,
    next_boundary,
)
from pytest_hemra.execute.gateway.usage import MAX_EVENT_BYTES, USAGE_MARKERS
from pytest_hemra.execute.gateway.wire import Wire

ASKED = b'"stream_options":{"include_usage":true}'
USAGE_KEY = b'"usage"'
# `"usage"`, its colon and a null, however spaced: how this upstream spells an empty usage
_NULL_VALUE = re.compile(rb'"usage"\s*:\s*null')
_USAGE_OPENED = re.compile(r'"usage"\s*:\s*')
_SPACE = b" \t\r\n"
MARKER = USAGE_MARKERS[Wire.CHAT]
_DECODER = json.JSONDecoder()


def with_usage_asked(body: bytes, data: dict[str, Any]) -> bytes | None:
    """The request body with `stream_options.include_usage` set, or None when it is set already
    or the call does not stream. `data` is `body` parsed. A client's `stream_options` of any
    other spelling (null, `{}`, `include_usage: false`, other options) is replaced by one that
    asks, its other options kept: a key put in front of the client's own would lose to it."""
    if data.get("stream") is not True:
        return None
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None
    opened = body.lstrip()
    if "stream_options" not in data and opened.startswith(b"{"):  # the common case: one key
        rest = opened[1:]  # put in front, the rest of the client's bytes kept as they were
        return b"{" + ASKED + (b"" if rest.lstrip().startswith(b"}") else b",") + rest
    asked = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps({**data, "stream_options": asked}, ensure_ascii=False).encode()


class AddedUsageFilter:
    """A Chat stream as the client would have had it without `include_usage`: fed what the
    upstream sent, it returns what to forward. Whole events only: a started event is held back
    until its blank line arrives (a usage chunk is known only whole); an event past
    MAX_EVENT_BYTES, and all after it, passes as it comes."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._is_passing = False
        self._null_usage: bytes | None = None  # as this upstream spells it, once seen

    def feed(self, chunk: bytes) -> bytes:
        if self._is_passing:
            return chunk
        pending = self._pending
        end = last_boundary_after(pending, chunk)
        if end < 0:  # no event ends here
            pending += chunk
            if len(pending) > MAX_EVENT_BYTES:
                self._is_passing = True
                return self.flush()
            return b""
        view = memoryview(chunk)
        if pending:
            events = b"".join((pending, view[:end]))
        else:
            events = chunk if end == len(chunk) else bytes(view[:end])
        pending[:] = view[end:]
        return self._cleaned(events)

    def flush(self) -> bytes:
        """What is held back: at the stream's end, an unfinished event as it came."""
        held = bytes(self._pending)
        self._pending.clear()
        return held

    def _cleaned(self, events: bytes) -> bytes:
        if self._null_usage is None:  # until learnt, one byte search a batch (a comment-only
            self._null_usage = _null_usage_spelling(events)  # batch, a server without it)
        if self._null_usage is not None:  # split and join: a fifth faster than replace here
            events = b"".join(events.split(self._null_usage))
        hit = events.find(MARKER)
        if hit < 0:
            return events
        pieces, position = [], 0
        while hit >= 0:
            start = event_start(events, hit)
            stop = next_boundary(events, hit, len(events))
            pieces += [events[position:start], _without_usage(events[start:stop])]
            position = stop
            hit = events.find(MARKER, position)
        pieces.append(events[position:])
        return b"".join(pieces)


def _null_usage_spelling(events: bytes) -> bytes | None:
    """The bytes an empty usage takes in a chunk of `events`, with the comma that separates it
    from its neighbour (`,"usage":null`, `, "usage": null`, or `"usage":null,` when it comes
    first); None if no chunk here has one."""
    at = events.find(USAGE_KEY)
    while at >= 0:
        null = _NULL_VALUE.match(events, at)
        if null is not None:
            before = len(events[:at].rstrip(_SPACE))
            if before > 0 and events[before - 1 : before] == b",":
                return events[before - 1 : null.end()]
            tail = events[null.end() :]
            after = null.end() + len(tail) - len(tail.lstrip(_SPACE))
            if events[after : after + 1] == b",":
                rest = events[after + 1 :]
                return events[at : after + 1 + len(rest) - len(rest.lstrip(b" \t"))]
        at = events.find(USAGE_KEY, at + 1)
    return None


def _without_usage(event: bytes) -> bytes:
    """An event without the usage the gateway asked for: gone when usage is all its chunk
    carries (no choices), else the chunk's `"usage":{...}` and its comma cut out of its bytes,
    the rest kept as sent. Should the cut not leave the same chunk without usage (a chunk split
    over several `data:` lines), its data is written anew, its other lines kept."""
    try:
        chunk = json.loads(event_data(event))
    except ValueError:
        return event
    if not isinstance(chunk, dict) or not isinstance(chunk.get("usage"), dict):
        return event
    if not chunk.get("choices"):
        return b""
    del chunk["usage"]
    text = event.decode("utf-8", "surrogateescape")  # decoded and encoded back: the same bytes
    cut = _usage_cut(text)
    if cut is not None:
        kept = (text[: cut[0]] + text[cut[1] :]).encode("utf-8", "surrogateescape")
        try:
            if json.loads(event_data(kept)) == chunk:
                return kept
        except ValueError:
            pass
    lines = [line for line in event.split(b"\n") if line and not line.startswith(b"data:")]
    ending = b"\r\n" if event.endswith(b"\r\n") else b"\n"
    data = b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode()
    return b"".join(line.removesuffix(b"\r") + ending for line in [*lines, data]) + ending


def _usage_cut(text: str) -> tuple[int, int] | None:
    """Where the `"usage": {...}` holding an object, with the comma on one side of it, lies in
    `text` (an event)."""
    for key in _USAGE_OPENED.finditer(text):
        if text[key.end() : key.end() + 1] != "{":
            continue
        try:
            _, stop = _DECODER.raw_decode(text, key.end())
        except ValueError:
            continue
        before = len(text[: key.start()].rstrip())
        if before > 0 and text[before - 1] == ",":
            return before - 1, stop
        after = stop + len(text[stop:]) - len(text[stop:].lstrip())
        if text[after : after + 1] == ",":
            rest = text[after + 1 :]
            return key.start(), after + 1 + len(rest) - len(rest.lstrip(" \t"))
    return None
