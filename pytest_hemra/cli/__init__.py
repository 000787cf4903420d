"""`hemra`: the command line over the same plugin (run and queue, reports, tools)."""

from pytest_hemra.cli.main import main

__all__ = ["main"]
