"""What a call costs: the run file's `[prices."MODEL"]` first, then the scripted model (free),
then Pydantic's `genai-prices` dataset (shipped with its package: read offline, never updated
over the network). A model in none of them costs "unknown", never 0.

HEMRA's four counts map onto the dataset's usage as it defines it: its `input_tokens` are every
input token, cached or not (HEMRA's `input_tokens` exclude cached input: `core/usage.py`), its
cache reads and writes are HEMRA's. Reasoning tokens are in HEMRA's output tokens (Anthropic's
and OpenAI's counts include them) and priced as output, as they are billed. The dataset's tiers
(a dearer rate past 200k input tokens) are chosen by the call's whole input, as providers do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from typing import TYPE_CHECKING, Any

from pytest_hemra.execute.gateway.wire import CallUsage
from pytest_hemra.resolve.prices import PriceOverride, run_prices
from pytest_hemra.resolve.upstreams import SCRIPTED_MODEL

if TYPE_CHECKING:
    from genai_prices.types import ModelInfo, Provider

DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")
PER = 1_000_000  # prices are per million tokens
MAJOR_PROVIDERS = ("anthropic", "openai", "google")  # looked in first for a name alone


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens; a dataset's tiered rate is its base tier's (a call's cost, from
    `cost_of`, takes the tier its input reaches)."""

    input: float
    output: float
    cache_read: float
    cache_write: float


@dataclass(frozen=True)
class Cost:
    usd: float | None  # None: the model has no price

    @property
    def is_known(self) -> bool:
        return self.usd is not None


FREE = ModelPrice(0.0, 0.0, 0.0, 0.0)


def _candidates(model: str) -> list[str]:
    """A name as the run file may spell it: exact, without a provider prefix, without a date."""
    names = [model]
    if "/" in model:
        names.append(model.split("/", 1)[1])
    names.extend(DATE_SUFFIX.sub("", name) for name in list(names))
    return list(dict.fromkeys(names))


def _override(price: PriceOverride) -> ModelPrice:
    return ModelPrice(
        price.input,
        price.output,
        price.input if price.cache_read is None else price.cache_read,
        price.input if price.cache_write is None else price.cache_write,
    )


class PriceTable:
    """The prices one run's calls are costed at: `overrides` (the run file's) over the dataset."""

    def __init__(self, overrides: Mapping[str, PriceOverride]) -> None:
        self.overrides = {name: _override(price) for name, price in overrides.items()}
        self._found: dict[str, tuple[Provider, ModelInfo] | None] = {}

    def _own(self, model: str) -> ModelPrice | None:
        for name in _candidates(model):
            if name in self.overrides:
                return self.overrides[name]
        return FREE if model.startswith(SCRIPTED_MODEL) else None

    def _dataset_model(self, model: str) -> tuple[Provider, ModelInfo] | None:
        if model not in self._found:
            self._found[model] = _find(model)
        return self._found[model]

    def price_of(self, model: str | None) -> ModelPrice | None:
        """A model's rates (a tiered one's base tier's), or None when it has none."""
        if not model:
            return None
        own = self._own(model)
        if own is not None:
            return own
        found = self._dataset_model(model)
        if found is None:
            return None
        from datetime import UTC, datetime

        prices = found[1].get_prices(datetime.now(tz=UTC))
        base = _rate(prices.input_mtok)
        return ModelPrice(
            base,
            _rate(prices.output_mtok),
            _rate(prices.cache_read_mtok, base),
            _rate(prices.cache_write_mtok, base),
        )

    def cost_of(self, usage: CallUsage) -> Cost:
        if not usage.model:
            return Cost(None)
        own = self._own(usage.model)
        if own is not None:
            return Cost(
                (
                    usage.input_tokens * own.input
                    + usage.output_tokens * own.output
                    + usage.cache_read_tokens * own.cache_read
                    + usage.cache_write_tokens * own.cache_write
                )
                / PER
            )
        found = self._dataset_model(usage.model)
        if found is None:
            return Cost(None)
        from genai_prices import Usage

        provider, info = found
        counted = Usage(
            input_tokens=usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )
        try:
            return Cost(float(info.calc_price(counted, provider).total_price))
        except ValueError:  # a price the dataset holds but cannot apply: unknown, not 0
            return Cost(None)


def _rate(price: Any, default: float = 0.0) -> float:
    """A dataset price's rate per million tokens: a tiered one's base tier."""
    if price is None:
        return default
    return float(price if isinstance(price, Decimal) else price.base)


def _find(model: str) -> tuple[Provider, ModelInfo] | None:
    """The dataset's model for a name: with a provider prefix (`anthropic/...`) as that
    provider's, else by the name alone."""
    from genai_prices.data_snapshot import get_snapshot

    snapshot = get_snapshot()
    tries: list[tuple[str, str | None]] = []
    if "/" in model:
        prefix, name = model.split("/", 1)
        tries.append((name, prefix))
        tries.append((name, None))
    tries.append((model, None))
    for name, provider_id in tries:
        try:
            return snapshot.find_provider_model(name, None, provider_id, None)
        except LookupError:
            continue
    # a name its provider's pattern does not claim (`davinci-002`, `gemma-3`): the first
    # provider that has it, the major ones first
    name = tries[0][0]
    ordered = sorted(snapshot.providers, key=lambda p: p.id not in MAJOR_PROVIDERS)
    for holder in ordered:
        found = holder.find_model(name)
        if found is not None:
            return holder, found
    return None


@cache
def _table(overrides: tuple[tuple[str, PriceOverride], ...]) -> PriceTable:
    return PriceTable(dict(overrides))


def price_table() -> PriceTable:
    """The prices of the run this process works for (`resolve.prices.use_run_prices`)."""
    return _table(tuple(sorted(run_prices().items())))


def cost_of(usage: CallUsage, table: PriceTable | None = None) -> Cost:
    return (table or price_table()).cost_of(usage)
