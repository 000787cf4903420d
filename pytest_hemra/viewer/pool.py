"""Store calls off the event loop: each runs in a worker thread, on that thread's own `Store`
(one SQLite connection per thread; WAL lets them read while runners write)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from pytest_hemra.store import Store

P = ParamSpec("P")
T = TypeVar("T")


class StorePool:
    def __init__(self, path: str | Path, workers: int = 4) -> None:
        self.path = path
        self._local = threading.local()
        self._stores: list[Store] = []
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="hemra-viewer")

    async def call(
        self, function: Callable[Concatenate[Store, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`function(store, *args, **kwargs)` in a worker thread."""
        bound = functools.partial(self._run, function, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, bound)

    def _run(
        self, function: Callable[Concatenate[Store, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        store: Store | None = getattr(self._local, "store", None)
        if store is None:
            store = Store(self.path)
            self._local.store = store
            with self._lock:
                self._stores.append(store)
        return function(store, *args, **kwargs)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for store in self._stores:
                store.close()
            self._stores.clear()
