"""A trial's status, a job's state and a run's status are written once, in `core/lifecycle.py`:
the stored words are unchanged, and no quoted state word is left outside `core/`.

How the check reads the tree: every string in the source of `pytest_hemra/` outside `core/`
(comments and the words inside docstrings' backticks are not strings quoted in code) is searched
for a state word of `TrialStatus`, `JobState` or `RunStatus` quoted whole, `"running"` or
`'running'`, the second inside SQL text too. A word is flagged whatever it means there: a
cancelled outcome is written `Outcome.CANCELLED`, an event kind `core/events.FINISHED`. A word
that only looks like a state (Docker's container status `running`, a column named `done`) says
so on its line with the comment `# not a lifecycle state`, and why.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from pytest_hemra.core.lifecycle import JobState, RunStatus, TrialStatus, sql_list
from pytest_hemra.core.outcome import Outcome

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_hemra"
MARKER = "not a lifecycle state"
WORDS = sorted({str(state) for kind in (TrialStatus, JobState, RunStatus) for state in kind})
QUOTED = re.compile(r"""(?<!\w)(["'])(""" + "|".join(WORDS) + r""")\1(?!\w)""")


def state_literals(root: Path) -> list[str]:
    """`file:line: "word"` for every quoted state word in the strings of `root`'s modules
    outside `core/`, lines carrying the marker comment left out."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] == "core":
            continue
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
        marked = {
            token.start[0]
            for token in tokens
            if token.type == tokenize.COMMENT and MARKER in token.string
        }
        for token in tokens:
            if token.type != tokenize.STRING:
                continue
            for match in QUOTED.finditer(token.string):
                line = token.start[0] + token.string.count("\n", 0, match.start())
                if line not in marked and token.start[0] not in marked:
                    found.append(f"{root.name}/{relative}:{line}: {match.group(0)}")
    return found


def test_no_state_word_is_quoted_outside_core() -> None:
    found = state_literals(PACKAGE)
    assert not found, "state literals outside core/ (use core/lifecycle.py):\n" + "\n".join(found)


def test_the_check_finds_a_state_word_put_back_in_code_and_in_sql(tmp_path: Path) -> None:
    package = tmp_path / "pytest_hemra"
    (package / "run").mkdir(parents=True)
    (package / "core").mkdir()
    (package / "core" / "lifecycle.py").write_text('RUNNING = "running"\n')
    (package / "run" / "job.py").write_text(
        '"""Runs a trial (`running`, while it runs)."""\n'
        "\n"
        "# a trial still 'running' is left alone\n"
        'if trial.status == "running":\n'
        "    db.execute(\n"
        "        \"UPDATE jobs SET state = 'cancelled'\"\n"
        "        \" WHERE state IN ('leased', 'cancelling')\"\n"
        "    )\n"
        'shown = {"running": 1}  # not a lifecycle state: a column\n'
        'kind = "cancel"\n'
    )
    assert state_literals(package) == [
        'pytest_hemra/run/job.py:4: "running"',
        "pytest_hemra/run/job.py:6: 'cancelled'",
        "pytest_hemra/run/job.py:7: 'leased'",
        "pytest_hemra/run/job.py:7: 'cancelling'",
    ]


def test_stored_words_are_unchanged() -> None:
    assert [str(s) for s in TrialStatus] == [
        "planned", "running", "finished", "cancelled", "deselected", "replaced",
    ]  # fmt: skip
    assert [str(s) for s in JobState] == [
        "queued", "leased", "cancelling", "cancelled", "done", "deselected", "replaced",
    ]  # fmt: skip
    assert [str(s) for s in RunStatus] == [
        "recorded", "queued", "running", "cancelled", "interrupted", "finished",
    ]  # fmt: skip
    assert TrialStatus.RUNNING == "running" and f"{JobState.LEASED}" == "leased"
    assert TrialStatus.CANCELLED == Outcome.CANCELLED  # one word, two types


def test_groups_read_as_the_sql_they_replace() -> None:
    assert sql_list(TrialStatus.UNFINISHED) == "('planned', 'running')"
    assert sql_list(JobState.LIVE) == "('leased', 'cancelling')"
    assert sql_list(JobState.OPEN) == "('queued', 'leased', 'cancelling')"
    assert sql_list(RunStatus.CLOSED) == "('cancelled', 'interrupted', 'finished')"
    assert TrialStatus.WITHOUT_OUTCOME == ("planned", "running", "deselected")
    assert set(TrialStatus.OVER) == {"finished", "cancelled"}
    assert set(RunStatus.OPEN) == {"recorded", "queued", "running"}
