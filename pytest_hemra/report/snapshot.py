"""A run's report read back as it was kept, while nothing it was built from has changed.

Building a report reads every trial of the run: 150,000 take seconds (`benchmarks/report.py`).
A closed run's report (finished, cancelled or interrupted) is kept in the store the first time
it is built (the terminal summary at the run's end builds it), with a key of everything it was
built from: HEMRA's own code (a digest of its source, so an upgrade builds reports anew), the
run's recorded plan, the judges' calibrations its flags read, and the run's trial rows
(`Store.trials_key`: their count and sum of revisions, which any write of a trial changes, a
resume's or a retry's included). While the key is the same, `report_of` loads the kept report
(the run's status and name, and the store's name, read now); otherwise it builds the report
and keeps the new one. A report loaded so says when it was kept (`RunReport.kept_at`), and the
text report prints it. Kept as Python's JSON of its fields (a NaN stays one), read back through
pydantic into the same dataclasses; a kept body that does not read is built anew.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_hemra.core.errors import StoreUnavailable
from pytest_hemra.core.lifecycle import RunStatus
from pytest_hemra.core.records import RunRecord
from pytest_hemra.report.tables import RunReport, build_report
from pytest_hemra.store import Store

if TYPE_CHECKING:
    from pydantic import TypeAdapter


def report_of(store: Store, run_id: str, *, rebuild: bool = False) -> RunReport:
    """The run's report: the kept one while its key holds (unless `rebuild`), else built now
    (and kept, for a closed run)."""
    run = store.run(run_id)
    key = report_key(store, run)  # read before the trials: a write after it changes the key
    kept = None if rebuild else store.stored_report(run_id)
    if kept is not None and kept.key == key:
        with contextlib.suppress(ValueError):  # a body that does not read: built anew below
            report = _adapter().validate_python(json.loads(kept.body))
            return replace(
                report, status=run.status, name=run.name, store=store.name, kept_at=kept.made_at
            )
    report = build_report(store, run_id)
    if run.status in RunStatus.CLOSED:
        # the store busy for now: the report stands, and is kept at its next reading
        with contextlib.suppress(StoreUnavailable):
            store.store_report(run_id, key, json.dumps(asdict(report)))
    return report


def report_key(store: Store, run: RunRecord) -> str:
    """What a run's report is built from, as one string (see the module's docstring)."""
    calibrations = [
        store.latest_calibration(judge.rubric_digest, judge.model)
        for judge in run.plan.judges
        if judge.model is not None
    ]
    read = json.dumps([run.spec, calibrations], sort_keys=True, default=str)
    inputs = hashlib.sha256(read.encode()).hexdigest()[:16]
    return f"{code_digest()}:{inputs}:{store.trials_key(run.id)}"


@cache
def code_digest() -> str:
    """A digest of HEMRA's Python source, read once a process."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@cache
def _adapter() -> TypeAdapter[RunReport]:
    from pydantic import TypeAdapter

    return TypeAdapter(RunReport)
