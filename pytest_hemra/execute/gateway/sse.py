"""Where server-sent events begin and end in a buffer, found by C-level byte search, never by
reading it line by line. An event ends at a blank line: `\n\n`, or `\n\r\n` in a CRLF stream."""

from __future__ import annotations


def last_boundary(buffer: bytes | bytearray, start: int = 0) -> int:
    """Where the last blank line at or after `start` ends; -1 if there is none."""
    plain = buffer.rfind(b"\n\n", start)
    crlf = buffer.rfind(b"\n\r\n", max(start, plain))
    return max(plain + 2 if plain >= 0 else -1, crlf + 3 if crlf >= 0 else -1)


def last_boundary_after(held: bytes | bytearray, chunk: bytes) -> int:
    """Where in `chunk` the last blank line ends, counting one that begins at the end of `held`
    (the bytes before it); -1 if none ends in `chunk`."""
    end = last_boundary(chunk)
    if end >= 0 or not held:
        return end
    edge = bytes(held[-2:])
    joint = last_boundary(edge + chunk[:2])
    return joint - len(edge) if joint > len(edge) else -1


def next_boundary(buffer: bytes | bytearray, start: int, end: int) -> int:
    """Where the first blank line at or after `start`, and ending by `end`, ends; -1 if none."""
    plain = buffer.find(b"\n\n", start, end)
    crlf = buffer.find(b"\n\r\n", start, plain + 3 if plain >= 0 else end)
    if crlf >= 0 and (plain < 0 or crlf < plain):
        return crlf + 3
    return plain + 2 if plain >= 0 else -1


def event_start(buffer: bytes | bytearray, at: int) -> int:
    """Where the event holding `buffer[at]` starts: past the blank line before it, if any."""
    plain = buffer.rfind(b"\n\n", 0, at)
    crlf = buffer.rfind(b"\n\r\n", max(0, plain), at)
    return max(plain + 2 if plain >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def event_data(event: bytes | bytearray) -> bytes:
    """An event's `data:` lines, joined; `event:`, `id:`, `retry:` and comments left out."""
    lines = []
    for line in bytes(event).split(b"\n"):
        line = line.removesuffix(b"\r")
        if line.startswith(b"data:"):
            lines.append(line[6:] if line.startswith(b"data: ") else line[5:])
    return b"\n".join(lines)
