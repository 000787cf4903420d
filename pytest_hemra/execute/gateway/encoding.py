"""Answers an upstream compresses although the gateway asked for `identity` (some proxies and
edges do): the client is passed the upstream's bytes with their `Content-Encoding`, and the
gateway decodes its own copy, a chunk at a time as it arrives, to scrub it and read its usage.

gzip (one member or several) and deflate (zlib-wrapped, or raw as some servers send it) are
decoded with zlib; another coding (`br`, `zstd`, a chain) cannot be read here, so its answer
cannot be scrubbed either: the gateway answers 502 (`relay`). A chunk is decoded a piece of at
most PIECE_BYTES at a time: a small answer that inflates enormously never sits whole in memory.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping

DECODABLE = frozenset({"gzip", "x-gzip", "deflate"})
PIECE_BYTES = 1 << 20
_GZIP_OR_ZLIB = 32 + zlib.MAX_WBITS  # zlib tells the two apart by their header
_RAW_DEFLATE = -zlib.MAX_WBITS


def content_coding(headers: Mapping[str, str]) -> str:
    """The answer's content coding, lower case; "" for none (or `identity`)."""
    coding = headers.get("Content-Encoding", "").strip().lower()
    return "" if coding == "identity" else coding


class Decoder:
    """One answer's bytes in, its decoded bytes out, in order; once its bytes stop decoding
    (a corrupt answer) it yields nothing more and `is_broken` says so."""

    def __init__(self, coding: str) -> None:
        self._is_deflate = coding == "deflate"
        self._inflate: zlib._Decompress | None = None
        self._head = b""  # deflate: the first bytes, until two tell zlib from raw
        self.is_broken = False

    def feed(self, raw: bytes) -> Iterator[bytes]:
        if self.is_broken or not raw:
            return
        if self._inflate is None:
            raw = self._head + raw
            if self._is_deflate and len(raw) < 2:
                self._head = raw
                return
            self._head = b""
            self._inflate = zlib.decompressobj(self._wbits(raw))
        try:
            yield from self._pieces(raw)
        except zlib.error:
            self.is_broken = True

    def flush(self) -> bytes:
        """What the decoder still holds, at the answer's end."""
        if self.is_broken or self._inflate is None:
            return b""
        try:
            return self._inflate.flush()
        except zlib.error:
            self.is_broken = True
            return b""

    def _pieces(self, raw: bytes) -> Iterator[bytes]:
        inflate = self._inflate
        assert inflate is not None
        while raw:
            piece = inflate.decompress(raw, PIECE_BYTES)
            raw = inflate.unconsumed_tail
            if piece:
                yield piece
            if inflate.eof:  # a gzip member ended: another may follow
                raw = inflate.unused_data + raw
                if not raw:
                    return
                self._inflate = inflate = zlib.decompressobj(self._wbits(raw))

    def _wbits(self, first: bytes) -> int:
        if not self._is_deflate:
            return _GZIP_OR_ZLIB
        is_zlib = first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0
        return zlib.MAX_WBITS if is_zlib else _RAW_DEFLATE
