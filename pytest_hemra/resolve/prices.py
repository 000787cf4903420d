"""The run file's `[prices."MODEL"]` tables: a model's price in USD per million tokens, which
wins over the price dataset's (docs/run-files.md), and the name of where prices came from.

A process learns its run's prices once, where it learns the run (`resolve_plan` in the
controller, `load_recorded` in every process that runs trials): `use_run_prices` sets them and
the gateway's pricing (`execute/gateway/prices.py`) reads `run_prices`. They are a process's, not
a call's, because one process runs one run at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

from pydantic import Field

from pytest_hemra.resolve.validation import Strict

DATASET = "genai-prices"  # Pydantic's price dataset, shipped with its package (read offline)


class PriceOverride(Strict):
    """One `[prices."MODEL"]` table. Cached input is priced as input when its rate is not
    given: never cheaper than the run file says."""

    input: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)
    cache_read: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cache_write: float | None = Field(default=None, ge=0, allow_inf_nan=False)


_run_prices: dict[str, PriceOverride] = {}


def use_run_prices(prices: Mapping[str, PriceOverride]) -> None:
    """The prices of the run this process works for (none: the dataset's alone)."""
    global _run_prices
    _run_prices = dict(prices)


def run_prices() -> Mapping[str, PriceOverride]:
    return _run_prices


def load_price_dataset() -> None:
    """Load the dataset (about a second, once a process) before the run's first call, which
    would otherwise wait for it on the gateway's loop, its latency counting the load."""
    from genai_prices import Usage, calc_price

    calc_price(Usage(input_tokens=1, output_tokens=1), "gpt-4.1")


def dataset_version() -> str:
    try:
        return version(DATASET)
    except PackageNotFoundError:  # pragma: no cover - a declared dependency
        return "unknown version"


def price_source(prices: Mapping[str, PriceOverride]) -> str:
    """Where a run's prices come from, as recorded with it and shown in its report:
    `genai-prices 0.2.3`, and `; run file for MODEL, ...` when it overrides or adds some."""
    source = f"{DATASET} {dataset_version()}"
    if prices:
        source += f"; run file for {', '.join(sorted(prices))}"
    return source
