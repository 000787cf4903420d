"""Upstreams: the model APIs the gateway forwards to (a run file's `[providers.<name>]`), and how
each expects its key. Called upstreams in the code so that "provider" means a sandbox provider."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_hemra.resolve.spec import ProviderSettings

SCRIPTED = "scripted"
SCRIPTED_MODEL = "hemra/scripted"


class ModelApi(BaseModel):
    """An upstream model API. `base_url` None means HEMRA's in-process scripted model."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str
    base_url: str | None = None
    auth: Literal["x-api-key", "bearer"] = "bearer"
    key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


BUILTIN_UPSTREAMS: dict[str, ModelApi] = {
    "anthropic": ModelApi(
        name="anthropic",
        base_url="https://api.anthropic.com",
        auth="x-api-key",
        key_env="ANTHROPIC_API_KEY",
    ),
    "openai": ModelApi(
        name="openai", base_url="https://api.openai.com", auth="bearer", key_env="OPENAI_API_KEY"
    ),
    SCRIPTED: ModelApi(name=SCRIPTED),
}


def configured_upstreams(settings: Mapping[str, ProviderSettings]) -> dict[str, ModelApi]:
    """The built-in providers with a run file's `[providers.<name>]` tables laid over them."""
    providers = dict(BUILTIN_UPSTREAMS)
    for name, table in settings.items():
        base = providers.get(name, ModelApi(name=name))
        changes = {k: v for k, v in table.model_dump().items() if v is not None}
        providers[name] = base.model_copy(update=changes)
    return providers


def key_variables(upstreams: Mapping[str, ModelApi]) -> set[str]:
    """The runner variables holding the real keys of the upstreams the gateway serves."""
    return {upstream.key_env for upstream in upstreams.values() if upstream.key_env}
