"""HEMRA's exception family and the one table that maps each to a trial outcome.

Every message is one line that says where (file, key, task) and what was expected.
An outcome is a value, not an exception: a harness that fails is a `fail`, never raised.
"""

from __future__ import annotations

from pytest_hemra.core.outcome import Outcome


class HemraError(Exception):
    """Base of every error HEMRA raises on purpose."""


class SpecError(HemraError):
    """A run file, harness file, task or flag is malformed; found at resolve, nothing recorded."""


class CapabilityError(SpecError):
    """The run requires something the sandbox provider cannot do."""


class StoreError(HemraError):
    """The store is missing, from another schema, or does not hold what was asked for."""


class InfraError(HemraError):
    """Infrastructure failed under a trial: image build, container, daemon."""


class VerifierError(HemraError):
    """The verifier gave no usable reward."""


class InputWarning(UserWarning):
    """Input HEMRA goes ahead with but does not act on (a task key it does not know), named."""


# exception type -> (outcome, retried as a new attempt?)
OUTCOME_OF_ERROR: dict[type[HemraError], tuple[Outcome, bool]] = {
    InfraError: (Outcome.INFRA_ERROR, True),
    VerifierError: (Outcome.VERIFIER_ERROR, False),
}


def outcome_of(error: BaseException) -> tuple[Outcome, bool]:
    """Map an exception raised under a trial to (outcome, retried?); unknown ones are infra."""
    for kind, verdict in OUTCOME_OF_ERROR.items():
        if isinstance(error, kind):
            return verdict
    return (Outcome.INFRA_ERROR, True)
