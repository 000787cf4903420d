"""`hemra engines`: a run file's pool of Docker engines, each with whether it answers, its
capacity, the HEMRA sandboxes running on it, the slots the store has placed there, and the
HEMRA images cached on it. Read only: nothing is started, removed or recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tabulate import tabulate

from pytest_hemra.core.errors import InfraError
from pytest_hemra.core.words import plural
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS
from pytest_hemra.execute.sandbox.images import SANDBOX_REPOSITORY, TASK_REPOSITORY
from pytest_hemra.execute.sandbox.pool import EnginePool
from pytest_hemra.resolve.spec import EngineSettings
from pytest_hemra.store import Store

NO_BRIDGE = "127.0.0.1"  # what a pool gives an engine with no bridge network (no sandbox network)


@dataclass(frozen=True)
class EngineStatus:
    name: str
    address: str
    capacity: int
    error: str | None  # None: it answers
    version: str | None = None
    running: int | None = None  # HEMRA sandboxes running there (containers labelled hemra=1)
    placed: int | None = None  # trials the store holds slots for there (None: no store)
    images: int | None = None  # HEMRA task and sandbox images cached there
    gateway_host: str | None = None

    @property
    def answers(self) -> bool:
        return self.error is None


def engine_statuses(engines: Sequence[EngineSettings], store: Store | None) -> list[EngineStatus]:
    pool = EnginePool(engines)
    load = store.engine_load() if store is not None else None
    found: list[EngineStatus] = []
    for engine in pool.engines:
        placed = None if load is None else load.get(engine.address, 0)
        error = pool.ping(engine)
        if error is None:
            try:
                client = pool.provider(engine).client
                running = client.containers.list(
                    filters={"label": "hemra=1", "status": "running"},  # not a lifecycle state
                    ignore_removed=True,
                )
                images = {
                    image.id
                    for repository in (TASK_REPOSITORY, SANDBOX_REPOSITORY)
                    for image in client.images.list(name=repository)
                }
                found.append(
                    EngineStatus(
                        engine.name,
                        engine.address,
                        engine.capacity,
                        None,
                        str(client.version().get("Version", "")),
                        len(running),
                        placed,
                        len(images),
                        pool.gateway_host_of(engine)
                        if engine.gateway_host or engine.is_local
                        else "missing (set gateway_host)",
                    )
                )
                continue
            except (*DOCKER_ERRORS, InfraError) as failure:
                error = " ".join(str(failure).split())[:200]
        found.append(
            EngineStatus(engine.name, engine.address, engine.capacity, error, placed=placed)
        )
    return found


def render_engines(statuses: Sequence[EngineStatus]) -> str:
    rows = [
        [
            status.name,
            status.address,
            f"up ({status.version})" if status.answers else f"down: {status.error}",
            status.capacity,
            "-" if status.running is None else status.running,
            "-" if status.placed is None else status.placed,
            "-" if status.images is None else status.images,
            "none (no bridge)" if status.gateway_host == NO_BRIDGE else status.gateway_host or "-",
        ]
        for status in statuses
    ]
    headers = ["engine", "address", "health", "capacity", "running"]  # not a lifecycle state
    headers += ["placed", "images", "gateway"]
    total = sum(status.capacity for status in statuses if status.answers)
    return (
        tabulate(rows, headers=headers)
        + f"\n{sum(s.answers for s in statuses)}/{plural(len(statuses), 'engine')} up,"
        + f" {plural(total, 'trial slot')}"
    )
