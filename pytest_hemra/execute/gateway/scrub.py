"""Real keys scrubbed out of what an upstream answers, before the sandbox, the store or the
trial folder sees it: an upstream that echoes the key it was sent (in an error message, a debug
field, a header) must not hand it to the agent.

A stream is scrubbed as it passes: a chunk's end that could be the start of a key is held back
until the next chunk shows whether it is one, so a key split across chunks is caught too and
nothing else is delayed."""

from __future__ import annotations

from collections.abc import Iterable

REDACTED = b"[redacted]"
MIN_KEY_CHARS = 8  # shorter "keys" are placeholders; scrubbing them would mangle every body


class KeyScrubber:
    """Replaces every occurrence of any of `keys` with `[redacted]` in a stream of chunks."""

    def __init__(self, keys: Iterable[str]) -> None:
        found = {key.encode() for key in keys if len(key) >= MIN_KEY_CHARS}
        self.keys = sorted(found, key=len, reverse=True)
        self._held = b""
        self.found = 0  # keys replaced so far

    def feed(self, chunk: bytes) -> bytes:
        """What of the stream so far can be passed on; a possible key's start is held back."""
        if not self.keys:
            return chunk
        data = self._replace(self._held + chunk)
        keep = self._possible_start(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        """The held-back end, at the end of the stream (it held no whole key)."""
        held, self._held = self._held, b""
        return held

    @property
    def is_holding(self) -> bool:
        """Whether the end of what was fed is held back (it may start a key)."""
        return bool(self._held)

    def text(self, value: str) -> str:
        """One whole value (a header) scrubbed."""
        for key in self.keys:
            value = value.replace(key.decode(), REDACTED.decode())
        return value

    def _replace(self, data: bytes) -> bytes:
        for key in self.keys:
            if key in data:
                self.found += 1
                data = data.replace(key, REDACTED)
        return data

    def _possible_start(self, data: bytes) -> int:
        """The length of the longest end of `data` that some key starts with: only where a
        key's first byte sits near the end is it compared (a byte search, not a loop)."""
        longest = 0
        for key in self.keys:
            first = key[:1]
            at = data.find(first, max(0, len(data) - len(key) + 1))
            while at >= 0 and len(data) - at > longest:
                if key.startswith(data[at:]):
                    longest = len(data) - at
                    break
                at = data.find(first, at + 1)
        return longest
