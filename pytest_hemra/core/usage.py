"""Tokens, counted one way everywhere: a call's, a trial's, what a harness says of itself.

`input_tokens` excludes cached input: OpenAI's `input_tokens`/`prompt_tokens` include
`cached_tokens`, which count as `cache_read_tokens` here; Anthropic reports them apart.
Every type that carries tokens (a gateway call, a stored call row, a trial's totals, a
harness's own report) is a `Usage` with more fields, so the four names, their order in stored
rows and JSON, and the total are declared once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
AGREEMENT_TOLERANCE = 0.05  # relative difference in total tokens before a trial is flagged


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    @property
    def tokens(self) -> Usage:
        """Just the four counts (a subclass's other fields left out)."""
        return Usage(
            self.input_tokens, self.output_tokens, self.cache_read_tokens, self.cache_write_tokens
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def counts(self) -> dict[str, int]:
        """The four counts by name, as stored and exported."""
        return {name: getattr(self, name) for name in TOKEN_FIELDS}

    @staticmethod
    def of(data: Mapping[str, Any]) -> Usage:
        """The four counts from a stored mapping (a result's usage, a harness's own report);
        a missing or empty count is 0."""
        return Usage(*(int(data.get(name) or 0) for name in TOKEN_FIELDS))


def disagrees(own_tokens: int, gateway_tokens: int) -> bool:
    """Whether a harness's own token total is off the gateway's by more than the tolerance."""
    largest = max(own_tokens, gateway_tokens)
    return largest > 0 and abs(own_tokens - gateway_tokens) / largest > AGREEMENT_TOLERANCE
