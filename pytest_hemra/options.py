"""HEMRA's `pytest11` entry point: its options and hook specs; nothing more until a run is asked.

A pytest plugin lives in people's development environments, so a session that does not ask for a
HEMRA run must not pay for one: this module imports only what `--help` needs. When a run is
asked for (`--hemra-run`, `--hemra-harness`, `--hemra-dataset`, `--hemra-resume`, or an xdist
worker handed a run id), `pytest_configure` loads the pytest face (`pytest_hemra.plugin`), which
registers the plug-in of this process's role, and makes pytest's plugin manager the registry every
face reads; the way pytest-xdist loads its `DSession` only when `-n` is given.
"""

from __future__ import annotations

import pytest

from pytest_hemra.core import hookspecs
from pytest_hemra.core.store_location import STORE_HELP
from pytest_hemra.resolve.overrides import OVERRIDE_FLAGS

PLUGIN = "pytest_hemra.plugin"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hemra", "HEMRA: evaluate coding-agent harnesses")
    group.addoption("--hemra-run", metavar="RUN_FILE", help="run file (TOML) to evaluate")
    group.addoption(
        "--hemra-store",
        metavar="PATH|URL",
        help=STORE_HELP,
    )
    for flag in OVERRIDE_FLAGS:
        if flag.repeats:
            group.addoption(
                flag.option, action="append", default=[], metavar=flag.metavar, help=flag.help
            )
        else:
            group.addoption(flag.option, type=flag.type, metavar=flag.metavar, help=flag.help)
    group.addoption(
        "--hemra-resume",
        metavar="RUN_ID",
        help="finish a recorded run: report finished trials from the store, run the rest",
    )
    group.addoption(
        "--hemra-resume-cancelled",
        action="store_true",
        help="with --hemra-resume, also run the trials that were cancelled",
    )
    group.addoption(
        "--hemra-fail-on",
        action="append",
        default=[],
        metavar="GATE",
        help="exit 1 when the run trips a gate: unfinished, failure, regression, score<X,"
        " HARNESS:score<X",
    )
    group.addoption(
        "--hemra-summary",
        metavar="PATH",
        help="write the run's tables, flags and gates as JSON here, for CI",
    )
    group.addoption(
        "--hemra-wide",
        action="store_true",
        help="print every column of the run's tables (default: the columns that fit the terminal)",
    )
    group.addoption(
        "--hemra-compare",
        metavar="RUN_ID",
        help="compare each harness with itself in an earlier run of the same store",
    )


def is_active(config: pytest.Config) -> bool:
    """Whether this session is (part of) a HEMRA run."""
    return bool(
        config.getoption("hemra_run")
        or config.getoption("hemra_harness")
        or config.getoption("hemra_dataset")
        or config.getoption("hemra_resume")
        or (hasattr(config, "workerinput") and "hemra_run_id" in config.workerinput)
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """In a HEMRA session, before pytest's configure puts its unraisable hook in place: a
    Ctrl-C that lands in a finaliser is never printed, then or after (`core/interrupts.py`)."""
    if is_active(config):
        _load_unrewritten(config)
        from pytest_hemra.core.interrupts import filter_interrupts

        filter_interrupts()


def _load_unrewritten(config: pytest.Config) -> None:
    """HEMRA's modules from here on load as any module does, not through pytest's assertion
    rewriting. pytest rewrites the asserts of every module of a plug-in's distribution; HEMRA's
    are not tests (their few asserts are invariants, whose messages gain nothing), and where no
    bytecode is written (PYTHONDONTWRITEBYTECODE, usual in CI images) pytest cannot cache what it
    rewrote, so every session and every xdist worker parsed and rewrote some 130 modules again
    (0.45 s a session, measured on this project's machine). pytest has no public switch for a
    plug-in's own package: the rewrite hook's set of marked names is edited, and a pytest that
    changes it keeps rewriting (`tests/test_wheel.py` notices)."""
    marked = getattr(config.pluginmanager.rewrite_hook, "_must_rewrite", None)
    if isinstance(marked, set):
        marked.discard(__name__.partition(".")[0])


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Load the pytest face when a run is asked for, and register its plug-in for this process's
    role: the run is resolved (or taken from `workerinput`) right here, late in configure (this
    hook is `trylast`), so a usage error stops pytest before the session starts."""
    if not is_active(config):
        return
    import importlib

    from pytest_hemra.core import registry

    registry.use(config.pluginmanager)
    importlib.import_module(PLUGIN).register(config)
