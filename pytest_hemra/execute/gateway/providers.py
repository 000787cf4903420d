"""Providers the gateway forwards to, and how each expects its key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_hemra.execute.gateway.wire import Wire
from pytest_hemra.resolve.spec import ProviderSettings

SCRIPTED = "scripted"
SCRIPTED_MODEL = "hemra/scripted"


class Provider(BaseModel):
    """An upstream model API. `base_url` None means HEMRA's in-process scripted model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    base_url: str | None = None
    auth: Literal["x-api-key", "bearer"] = "bearer"
    key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


BUILTIN_PROVIDERS: dict[str, Provider] = {
    "anthropic": Provider(
        name="anthropic",
        base_url="https://api.anthropic.com",
        auth="x-api-key",
        key_env="ANTHROPIC_API_KEY",
    ),
    "openai": Provider(
        name="openai", base_url="https://api.openai.com", auth="bearer", key_env="OPENAI_API_KEY"
    ),
    SCRIPTED: Provider(name=SCRIPTED),
}


def route_call(wire: Wire, model: str | None, trial_provider: str | None) -> str:
    """Where a call goes: the scripted model by name, else the trial's provider, else by wire."""
    if model and model.startswith(SCRIPTED_MODEL):
        return SCRIPTED
    if trial_provider:
        return trial_provider
    return "anthropic" if wire in (Wire.ANTHROPIC, Wire.COUNT_TOKENS) else "openai"


def configured_providers(settings: Mapping[str, ProviderSettings]) -> dict[str, Provider]:
    """The built-in providers with a run file's `[providers.<name>]` tables laid over them."""
    providers = dict(BUILTIN_PROVIDERS)
    for name, table in settings.items():
        base = providers.get(name, Provider(name=name))
        changes = {k: v for k, v in table.model_dump().items() if v is not None}
        providers[name] = base.model_copy(update=changes)
    return providers
