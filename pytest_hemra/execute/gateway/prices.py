"""Prices from the versioned table shipped in `prices.toml`; unknown models cost "unknown"."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from pytest_hemra.execute.gateway.wire import CallUsage

PRICES_FILE = Path(__file__).with_name("prices.toml")
DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")


class ModelPrice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float = Field(ge=0)
    cache_write: float = Field(ge=0)


class PriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int
    taken: str
    currency: str
    models: dict[str, ModelPrice]

    def price_of(self, model: str | None) -> ModelPrice | None:
        if not model:
            return None
        for name in _candidates(model):
            if name in self.models:
                return self.models[name]
        return None


@dataclass(frozen=True)
class Cost:
    usd: float | None  # None: the model is not in the table

    @property
    def is_known(self) -> bool:
        return self.usd is not None


def _candidates(model: str) -> list[str]:
    names = [model]
    if "/" in model:
        names.append(model.split("/", 1)[1])
    names.extend(DATE_SUFFIX.sub("", name) for name in list(names))
    return names


@cache
def price_table(path: Path = PRICES_FILE) -> PriceTable:
    with path.open("rb") as handle:
        return PriceTable.model_validate(tomllib.load(handle))


def cost_of(usage: CallUsage, table: PriceTable | None = None) -> Cost:
    price = (table or price_table()).price_of(usage.model)
    if price is None:
        return Cost(None)
    return Cost(
        (
            usage.input_tokens * price.input
            + usage.output_tokens * price.output
            + usage.cache_read_tokens * price.cache_read
            + usage.cache_write_tokens * price.cache_write
        )
        / 1_000_000
    )
