"""The plug-in registry: one pluggy manager that every face (pytest, `hemra`, the viewer) reads.

Under pytest it is pytest's own plugin manager (`use(config.pluginmanager)`), so a plugin
installed as a `pytest11` entry point or written in a `conftest.py` is seen. Outside pytest
(`hemra serve`, `hemra cancel`, `hemra view`, `hemra run --detach`) a manager of the same
project name is made on first use and loads the same `pytest11` entry points, so the same
plugins are found either way. HEMRA's own sandbox providers and harness kinds are plug-ins
too, registered from `BUILTIN_PLUGINS` by name, so nothing here imports the layers above it.
"""

from __future__ import annotations

import importlib
from typing import Any

import pluggy

from pytest_hemra.core import hookspecs

PROJECT = "pytest"  # pytest only calls hook implementations named pytest_*, so ours share it
BUILTIN_PLUGINS = (
    "pytest_hemra.execute.sandbox.builtin",
    "pytest_hemra.execute.kinds.builtin",
)

_manager: pluggy.PluginManager | None = None


def use(manager: pluggy.PluginManager) -> pluggy.PluginManager:
    """Make `manager` this process's registry (pytest's, once a HEMRA run is asked for)."""
    global _manager
    if not hasattr(manager.hook, "pytest_hemra_harness_kinds"):
        manager.add_hookspecs(hookspecs)
    for name in BUILTIN_PLUGINS:
        if manager.get_plugin(name) is None:
            manager.register(importlib.import_module(name), name=name)
    _manager = manager
    return manager


def manager() -> pluggy.PluginManager:
    """This process's registry; outside pytest, one that loads the `pytest11` entry points."""
    if _manager is not None:
        return _manager
    standalone = pluggy.PluginManager(PROJECT)
    standalone.add_hookspecs(hookspecs)
    standalone.load_setuptools_entrypoints("pytest11")
    return use(standalone)


def sandbox_providers() -> dict[str, Any]:
    """Every sandbox provider: {name: factory}; a plug-in's name replaces HEMRA's own."""
    return _merged("pytest_hemra_sandbox_providers")


def harness_kinds() -> dict[str, Any]:
    """Every harness kind: {name: kind}; a plug-in's name replaces HEMRA's own."""
    return _merged("pytest_hemra_harness_kinds")


def _merged(hook_name: str) -> dict[str, Any]:
    """Each implementation's {name: thing}, HEMRA's own first so that plug-ins win."""
    impls = getattr(manager().hook, hook_name).get_hookimpls()
    impls.sort(key=lambda impl: impl.plugin_name not in BUILTIN_PLUGINS)
    found: dict[str, Any] = {}
    for impl in impls:
        found.update(impl.function())
    return found


def reset() -> None:
    """Forget the registry (tests that switch between managers in one process)."""
    global _manager
    _manager = None
