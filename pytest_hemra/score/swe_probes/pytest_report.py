"""HEMRA's pytest plugin for the SWE track (loaded with `-p`, under a name chosen per trial):
each test's outcome, written at the end of the session to `REPORT`, a path HEMRA writes into its
copy of this file (a file of its own name in a folder nobody else can list). It keeps pytest's
summary line, which HEMRA checks the report against, however quiet the task's command asks it to
be."""

from __future__ import annotations

import os
from typing import Any

import pytest

REPORT = ""  # HEMRA's copy names the report here
_outcomes: dict[str, str] = {}
_files: dict[str, str] = {}
_root = [os.getcwd()]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    if getattr(config.option, "verbose", 0) < -1:  # `-qq` hides the summary line
        config.option.verbose = -1
    _root[0] = str(getattr(config, "rootpath", None) or config.rootdir)


def pytest_itemcollected(item: Any) -> None:
    _files[item.nodeid] = str(getattr(item, "path", None) or item.fspath)


def pytest_collectreport(report: Any) -> None:
    if report.failed:  # a module that failed to import: one failure, as pytest counts it
        _outcomes[report.nodeid] = "failed"
        _files[report.nodeid] = os.path.join(_root[0], report.nodeid.split("::")[0])


def pytest_runtest_logreport(report: Any) -> None:
    state = _outcomes.get(report.nodeid)
    if report.failed:  # any phase: setup, call or teardown
        _outcomes[report.nodeid] = "failed"
    elif report.when == "call" and report.passed and state != "failed":
        _outcomes[report.nodeid] = "passed"  # an xpass that is not strict passes, as pytest says
    elif state is None:
        _outcomes[report.nodeid] = "skipped"  # until its call passes; skips and xfails stay
    if report.nodeid not in _files:
        _files[report.nodeid] = os.path.join(_root[0], report.nodeid.split("::")[0])


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    lines = []
    for nodeid, outcome in _outcomes.items():
        file = os.path.relpath(_files.get(nodeid, ""), os.getcwd()) if nodeid in _files else ""
        lines.append("\t".join(_clean(part) for part in (outcome, file, nodeid)) + "\n")
    fd = os.open(REPORT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, "".join(lines).encode("utf-8", "replace"))
    finally:
        os.close(fd)


def _clean(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")
