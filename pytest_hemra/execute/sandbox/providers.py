"""The sandbox provider a run's `[sandbox]` settings name, as the plug-in registry gives it (or
the factories given), spread over the run's `[[sandbox.engines]]` when it names some: one place
builds it for resolve, for every runner and for `hemra worker`, `hemra cancel` and the viewer."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pytest_hemra.core import registry
from pytest_hemra.core.errors import HemraError, SpecError
from pytest_hemra.execute.sandbox import SandboxProvider
from pytest_hemra.resolve.spec import SandboxSettings
from pytest_hemra.store import Store

ProviderFactory = Callable[[], SandboxProvider]


def sandbox_provider(
    settings: SandboxSettings,
    factories: Mapping[str, ProviderFactory] | None = None,
    *,
    store: Store | None = None,
    owner: str = "",
    source: str | None = None,
) -> SandboxProvider:
    """The provider `settings.provider` names, from `factories` (else the registry's); over the
    settings' engines, its pool (whose slots `owner` holds in `store`). With `source` (the run
    file), a provider it cannot build is a SpecError naming the file and the key; without (a
    recorded run), a HemraError saying it is not installed here."""
    found = registry.sandbox_providers() if factories is None else factories
    factory = found.get(settings.provider)
    known = ", ".join(sorted(found))
    if factory is None:
        if source is None:
            raise HemraError(f"sandbox provider '{settings.provider}' is not installed ({known})")
        raise SpecError(
            f"{source}: key 'sandbox.provider': no sandbox provider named "
            f"{settings.provider!r} (known: {known})"
        )
    provider = factory()
    if not settings.engines:
        return provider
    pooled = provider.pooled(settings.engines, store, owner, source or "run file")
    if pooled is None:
        raise SpecError(
            f"{source or 'the run'}: key 'sandbox.engines': sandbox provider "
            f"{settings.provider!r} cannot spread over a pool of engines"
        )
    return pooled
