"""Chosen fields of one SSE event's JSON, read as the event streams past, without holding it.

An event too long to hold (a Responses stream's final event carries the whole response: a long
output makes it megabytes) is read here instead of being cut out and decoded: its `data:` lines
are scanned for JSON structure only (quotes, brackets, colons, commas, found by C-level search;
a string's body is skipped with one byte search for its closing quote), the path of keys to the
current value is tracked, and only the values at the chosen paths are copied (each up to
MAX_VALUE_BYTES). Memory stays bounded whatever the event's size, and the usage is found wherever
in the response the provider puts it. `event:`, `id:` and comment lines are skipped.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_VALUE_BYTES = 64 * 1024  # a chosen value longer than this is dropped
MAX_KEY_BYTES = 256
MAX_DEPTH = 512  # deeper, the scan gives up
_STRUCTURE = re.compile(rb'["{}\[\]:,]')
# inside a container no chosen path runs through, only brackets count: whole strings and
# everything but brackets skipped by the regex engine (a string left open stops it at its quote)
_SKIPPED = re.compile(rb'(?:[^"{}\[\]]+|"(?:[^"\\]|\\.)*")*')

Path = tuple[str, ...]


class FieldScanner:
    """Fed an SSE event's bytes in order from its first, collects the JSON values at `paths`
    (keys from the top-level object down) in `found`, as raw JSON text."""

    def __init__(self, paths: frozenset[Path]) -> None:
        self._paths = paths
        self._prefixes = {path[:length] for path in paths for length in range(len(path))}
        self._is_skippable = False  # the open container leads to no chosen path
        self.found: dict[Path, bytes] = {}
        self.is_given_up = False
        self._keys: list[str | None] = []  # per open container: its current key (None: array)
        self._is_expecting_key = False
        self._is_in_string = False
        self._is_escaped = False  # in a string, the bytes so far end with a lone backslash
        self._key: bytearray | None = None  # the object key being read
        self._last_key = ""
        self._value: bytearray | None = None  # a chosen value being copied
        self._value_path: Path = ()
        self._value_depth = 0
        self._is_data_line = False
        self._field = bytearray()  # at a line's start: its field name so far
        self._is_skipping_line = False

    def value(self, path: Path) -> Any:
        """A found value, decoded; None if it was not found or is not JSON."""
        raw = self.found.get(path)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def feed(self, chunk: bytes | bytearray) -> None:
        position, size = 0, len(chunk)
        while position < size and not self.is_given_up:
            line_end = chunk.find(b"\n", position)
            end = size if line_end < 0 else line_end
            if self._is_data_line:
                self._scan(chunk, position, end)
            elif not self._is_skipping_line:
                colon = chunk.find(b":", position, end)
                self._field += chunk[position : end if colon < 0 else colon]
                if colon >= 0:
                    self._is_data_line = bytes(self._field) == b"data"
                    self._is_skipping_line = not self._is_data_line
                    if self._is_data_line:
                        self._scan(chunk, colon + 1, end)
            if line_end < 0:
                return
            self._is_data_line = self._is_skipping_line = False
            self._field.clear()
            position = line_end + 1

    def _scan(self, chunk: bytes | bytearray, position: int, end: int) -> None:
        """JSON text in `chunk[position:end]`, one data line's (or its part in this chunk)."""
        while position < end:
            if self._is_in_string:
                position = self._string_end(chunk, position, end)
                continue
            if self._is_skippable:
                skipped = _SKIPPED.match(chunk, position, end)
                position = skipped.end() if skipped is not None else position
                if position >= end:
                    return
            mark = _STRUCTURE.search(chunk, position, end)
            stop = end if mark is None else mark.start()
            if self._value is not None:
                self._copy(chunk, position, stop)
            if mark is None:
                return
            self._structure(chunk[stop : stop + 1], chunk, stop)
            position = stop + 1

    def _string_end(self, chunk: bytes | bytearray, position: int, end: int) -> int:
        """Past a string's closing quote, or `end` if it goes on beyond."""
        quote = chunk.find(b'"', position, end)
        while quote >= 0:
            run = quote
            while run > position and chunk[run - 1] == 0x5C:  # backslashes before it
                run -= 1
            slashes = quote - run + (int(self._is_escaped) if run == position else 0)
            if slashes % 2 == 0:
                break
            quote = chunk.find(b'"', quote + 1, end)
        stop = end if quote < 0 else quote + 1
        if self._key is not None and len(self._key) < MAX_KEY_BYTES:
            self._key += chunk[position : stop if quote < 0 else quote]
        if self._value is not None:
            self._copy(chunk, position, stop)
        if quote >= 0:
            self._is_in_string = self._is_escaped = False
            if self._key is not None:
                self._last_key = self._key.decode(errors="replace")
                self._key = None
            return stop
        run = end
        while run > position and chunk[run - 1] == 0x5C:
            run -= 1
        trailing = end - run + (int(self._is_escaped) if run == position else 0)
        self._is_escaped = trailing % 2 == 1
        return end

    def _structure(self, mark: bytes | bytearray, chunk: bytes | bytearray, at: int) -> None:
        keys = self._keys
        if mark == b'"':
            self._is_in_string = True
            if self._is_expecting_key:
                self._key = bytearray()
            if self._value is not None:
                self._copy(chunk, at, at + 1)
            return
        if self._value is not None and len(keys) == self._value_depth and mark in b",}]":
            self.found[self._value_path] = bytes(self._value)
            self._value = None
        if self._value is not None:
            self._copy(chunk, at, at + 1)
        if mark == b":":
            if self._is_expecting_key and keys:
                keys[-1] = self._last_key
                self._is_expecting_key = False
                path = tuple(keys)
                if self._value is None and None not in keys and path in self._paths:
                    self._value, self._value_path = bytearray(), path  # type: ignore[assignment]
                    self._value_depth = len(keys)
        elif mark == b",":
            self._is_expecting_key = bool(keys) and keys[-1] is not None
        elif mark in b"{[":
            keys.append("" if mark == b"{" else None)
            self._is_expecting_key = mark == b"{"
            if len(keys) > MAX_DEPTH:
                self.is_given_up = True
            self._is_skippable = self._value is None and not self._may_lead_on()
        else:
            if keys:
                keys.pop()
            self._is_expecting_key = False
            self._is_skippable = self._value is None and not self._may_lead_on()

    def _may_lead_on(self) -> bool:
        """Whether a chosen path may run through the open container."""
        keys = self._keys
        return not keys or (keys[-1] is not None and tuple(keys[:-1]) in self._prefixes)

    def _copy(self, chunk: bytes | bytearray, start: int, stop: int) -> None:
        assert self._value is not None
        if len(self._value) + stop - start > MAX_VALUE_BYTES:
            self._value = None
            return
        self._value += chunk[start:stop]
