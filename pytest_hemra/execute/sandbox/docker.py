"""HEMRA's docker provider, as the plug-in registry gives it (`builtin.py`): the runner's own
Docker engine (`docker_engine.py`), which a run naming `[[sandbox.engines]]` spreads over a pool
of engines (`pool.py`), each of them a `DockerEngine`."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_hemra.execute.sandbox import SandboxProvider
from pytest_hemra.execute.sandbox.docker_engine import DockerEngine
from pytest_hemra.execute.sandbox.pool import EnginePool
from pytest_hemra.resolve.spec import EngineSettings
from pytest_hemra.store import Store


class DockerProvider(DockerEngine):
    """One Docker engine (see `DockerEngine`), or a pool of them for a run that names some."""

    def pooled(
        self, engines: Sequence[EngineSettings], store: Store | None, owner: str, source: str
    ) -> SandboxProvider | None:
        """A pool of the engines: each trial placed on one with a free slot (`EnginePool`)."""
        return EnginePool(engines, store, owner, source)
