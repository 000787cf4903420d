"""How a trial ended: one `Outcome`, and the groups every face reads it through.

A `StrEnum`, so a stored or printed outcome is its plain string (`"pass"`) and compares equal to
it. The groups (docs: DESIGN.md, "Outcomes"):

| group        | outcomes                                  | read by                           |
|--------------|-------------------------------------------|-----------------------------------|
| `SCORED`     | pass, fail, timeout, harness_error,       | scores, statistics, fairness      |
|              | tampered, verifier_error (both reward 0)  |                                   |
| `FAILED`     | fail, timeout, harness_error, tampered,   | pytest: reported as failed        |
|              | verifier_error                            |                                   |
| `ERROR`      | infra_error                               | pytest: reported as an error      |
| `UNFINISHED` | verifier_error, infra_error, cancelled    | `hemra run`'s exit code, gates    |

A verifier_error is the agent's result (the sandbox it left gave the verifier nothing to read),
scored 0 so that no harness raises its numbers by making trials unscoreable; it stays in
`UNFINISHED` too, so that `hemra run` still says a task's verifier gave no reward. Only
infra_error and cancelled leave scores.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar


class Outcome(StrEnum):
    PASS = "pass"  # the verifier's reward reached the pass threshold
    FAIL = "fail"  # a reward below it
    TIMEOUT = "timeout"  # the agent ran past its deadline; still verified
    HARNESS_ERROR = "harness_error"  # the harness crashed, exited non-zero or refused; verified
    TAMPERED = "tampered"  # the agent changed what scores it: reward 0, flagged
    VERIFIER_ERROR = "verifier_error"  # no usable reward after the agent's turn: reward 0
    INFRA_ERROR = "infra_error"  # image, container, daemon, gateway upstream...: retried
    CANCELLED = "cancelled"  # Ctrl-C, `hemra cancel`: never counted as failed

    SCORED: ClassVar[frozenset[Outcome]]
    FAILED: ClassVar[frozenset[Outcome]]
    ERROR: ClassVar[frozenset[Outcome]]
    UNFINISHED: ClassVar[frozenset[Outcome]]

    @property
    def is_scored(self) -> bool:
        """Counted in scores: a reward, or 0 for a tampered or unscoreable trial."""
        return self in Outcome.SCORED

    @classmethod
    def groups(cls) -> dict[str, Any]:
        """Every outcome and each group, as lists of strings (what the viewer's API serves)."""
        return {
            "outcomes": [str(o) for o in cls],
            **{
                name.lower(): [str(o) for o in cls if o in getattr(cls, name)]
                for name in ("SCORED", "FAILED", "ERROR", "UNFINISHED")
            },
        }


Outcome.FAILED = frozenset(
    {
        Outcome.FAIL,
        Outcome.TIMEOUT,
        Outcome.HARNESS_ERROR,
        Outcome.TAMPERED,
        Outcome.VERIFIER_ERROR,
    }
)
Outcome.SCORED = Outcome.FAILED | {Outcome.PASS}
Outcome.ERROR = frozenset({Outcome.INFRA_ERROR})
Outcome.UNFINISHED = frozenset({Outcome.VERIFIER_ERROR, Outcome.INFRA_ERROR, Outcome.CANCELLED})


class Cause(StrEnum):
    """Why a trial ended as it did, beside its outcome, when the reason is not the task's
    verdict (a trial's `cause`; None when it has none)."""

    ENGINE_OUTAGE = "engine_outage"  # its engine stopped answering, and came back
    # its engine, answering pings, did not answer the sandbox's start in time (overloaded)
    ENGINE_BUSY = "engine_busy"
    RUNNER_DISK_FULL = "runner_disk_full"  # the disk of the runner's store and trial folders
    ENGINE_GONE = "engine_gone"  # its engine did not answer within HEMRA_ENGINE_GIVE_UP_SECS
    VERIFIER_OFFLINE = "verifier_offline"  # its verifier tried the network with it cut
    TAMPERED = "tampered"  # the agent changed what scores it (evidence in tampered.json)

    WAITED_OUT: ClassVar[frozenset[Cause]]  # not the trial's doing: run again, no retry used


Cause.WAITED_OUT = frozenset({Cause.ENGINE_OUTAGE, Cause.ENGINE_BUSY, Cause.RUNNER_DISK_FULL})


class SweClass(StrEnum):
    """The SWE track's class of a trial's result (`score/swe.py`; a trial's `swe_class`)."""

    TAMPERED = "tampered"  # the agent changed the test infrastructure
    SUCCESS = "success"
    PARTIAL = "partial"
    OVERFIT = "overfit"
    TIMEOUT = "timeout"
    REFUSAL = "refusal"
    WRONG_APPROACH = "wrong_approach"
    CRASH = "crash"
    NO_CHANGE = "no_change"


# a failed trial's reason, when the clean room killed processes the agent left listening on a
# port (its task's tests may need them: `[hemra] keep_agent_processes`); `hemra check` reads it
KILLED_LISTENERS = "the clean room killed the agent's processes listening on port"
