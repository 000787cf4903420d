"""HEMRA's unittest runner for the SWE track: `python -m unittest ARGS` as the task wrote it, run
as `python THIS_FILE ARGS`, each test's outcome written at the end to `REPORT` (a path HEMRA
writes into its copy of this file). unittest is imported before the working folder joins
sys.path, so a module of the agent's named like it, or like one it imports, is never loaded."""

from __future__ import annotations

import os
import sys
import unittest  # with all unittest.main() needs
from typing import Any

REPORT = ""  # HEMRA's copy names the report here
sys.path[0] = os.getcwd()  # as `python -m unittest` has it, not this file's folder

_outcomes: dict[str, str] = {}
_files: dict[str, str] = {}


def _note(test: Any, outcome: str) -> None:
    name = test.id()
    if _outcomes.get(name) == "failed":
        return
    _outcomes[name] = outcome
    module = sys.modules.get(type(test).__module__)
    _files[name] = str(getattr(module, "__file__", None) or "")


class _Result(unittest.TextTestResult):
    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        _note(test, "passed")

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        _note(test, "failed")

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        _note(test, "failed")

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            _note(test, "failed")

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        _note(test, "skipped")

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        _note(test, "skipped")

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        _note(test, "passed")


class _Runner(unittest.TextTestRunner):
    resultclass = _Result  # type: ignore[assignment]


def _clean(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")


def main() -> int:
    program = unittest.main(
        module=None, argv=["python -m unittest", *sys.argv[1:]], testRunner=_Runner, exit=False
    )
    root = os.getcwd()
    lines = [
        "\t".join(
            _clean(part)
            for part in (outcome, os.path.relpath(_files[name], root) if _files[name] else "", name)
        )
        + "\n"
        for name, outcome in _outcomes.items()
    ]
    fd = os.open(REPORT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, "".join(lines).encode("utf-8", "replace"))
    finally:
        os.close(fd)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
