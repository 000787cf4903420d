"""`hemra`'s exit codes: one meaning each, the same for every command, and pytest's own numbers
(`hemra run` is a pytest session and returns its status). `docs/cli.md` and `hemra --help` list
this table; a test checks that what the CLI returns is what it says."""

from __future__ import annotations

import textwrap
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    VERDICT = 1
    INTERRUPTED = 2
    INTERNAL = 3
    REFUSED = 4
    NOTHING_TO_RUN = 5


MEANINGS: dict[Exit, str] = {
    Exit.OK: "done: every trial has a result (failing tasks are results too), every check passed",
    Exit.VERDICT: "done, and the verdict is no: `hemra run` a cell did not finish (infra_error,"
    " verifier_error, cancelled) or a --fail-on gate tripped; `check` a task is broken;"
    " `calibrate` the judge drifted; `canary` a count differs; `engines` no engine answers;"
    " `clean` the engine does not answer, or something could not be removed."
    " (Plain `pytest --hemra-run` keeps pytest's rule: 1 when any trial failed.)",
    Exit.INTERRUPTED: "interrupted (Ctrl-C): what did not finish is recorded cancelled",
    Exit.INTERNAL: "an internal error: a bug in HEMRA or a plug-in; please report it",
    Exit.REFUSED: "refused: a flag, run file, harness, dataset, id or store HEMRA cannot use (one"
    " line on stderr says which and what was expected); nothing ran, nothing was recorded",
    Exit.NOTHING_TO_RUN: "nothing to run: the selection left no trial",
}


def exit_codes_text() -> str:
    """The table as `--help` prints it."""
    lines = ["exit codes:"]
    for code, meaning in MEANINGS.items():
        lines += textwrap.wrap(
            meaning, width=88, initial_indent=f"  {int(code)}  ", subsequent_indent="     "
        )
    return "\n".join(lines)
