"""How a count reads in text a user sees: `1 task`, `2 tasks`, never `1 tasks` or `task(s)`;
thousands grouped (`1,200 trials`) as the viewer's `plural` in dom.js groups them."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`COUNT NOUN`, the noun in the plural unless the count is 1 (`many` when `+s` is wrong:
    `plural(2, "sandbox", "sandboxes")`)."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"
