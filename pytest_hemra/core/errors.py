"""HEMRA's exception family and the one table that maps each to a trial outcome.

Every message is one line that says where (file, key, task) and what was expected.
An outcome is a value, not an exception: a harness that fails is a `fail`, never raised.
"""

from __future__ import annotations

from collections.abc import Iterator

from pytest_hemra.core.outcome import Outcome


class HemraError(Exception):
    """Base of every error HEMRA raises on purpose."""


class SpecError(HemraError):
    """A run file, harness file, task or flag is malformed; found at resolve, nothing recorded."""


class CapabilityError(SpecError):
    """The run requires something the sandbox provider cannot do."""


class StoreError(HemraError):
    """The store is missing, from another schema, or does not hold what was asked for."""


class StoreUnavailable(StoreError):
    """The store cannot be written for now: its disk is full, or another process has held its
    lock past the timeout. Runners wait it out (`core/backoff.py`) before giving up."""


class InfraError(HemraError):
    """Infrastructure failed under a trial: image build, container, daemon."""


class EngineOutage(InfraError):
    """The trial's Docker engine stopped answering under it (stopped, killed, restarting)."""


class VerifierError(HemraError):
    """The verifier gave no usable reward."""


class Tampered(HemraError):
    """The agent changed what scores its trial (a reward its verifier did not write, a tool the
    verifier runs, test infrastructure): the trial ends `tampered`, reward 0, with `evidence`,
    one "path: why" line each."""

    def __init__(self, message: str, evidence: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.evidence = evidence


class InputWarning(UserWarning):
    """Input HEMRA goes ahead with but does not act on (a task key it does not know), named."""


# exception type -> (outcome, retried as a new attempt?)
OUTCOME_OF_ERROR: dict[type[HemraError], tuple[Outcome, bool]] = {
    InfraError: (Outcome.INFRA_ERROR, True),
    VerifierError: (Outcome.VERIFIER_ERROR, False),
    Tampered: (Outcome.TAMPERED, False),
}


def outcome_of(error: BaseException) -> tuple[Outcome, bool]:
    """Map an exception raised under a trial to (outcome, retried?); unknown ones are infra."""
    for kind, verdict in OUTCOME_OF_ERROR.items():
        if isinstance(error, kind):
            return verdict
    return (Outcome.INFRA_ERROR, True)


def causes(error: BaseException) -> Iterator[BaseException]:
    """`error`, then every error it was raised from or while handling, each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        found = pending.pop()
        if found is None or id(found) in seen:
            continue
        seen.add(id(found))
        yield found
        pending += [found.__cause__, found.__context__]
