"""The store's tables, indexes and schema version, defined once for SQLite and PostgreSQL as
SQLAlchemy `Table`s on one `MetaData`, and how rows become records (read by column name).

Column types: `Text`, `BigInteger` (SQLite's INTEGER affinity), `Double` (REAL; PostgreSQL's
double precision). An integer `id` is SQLite's rowid (`INTEGER PRIMARY KEY`) and PostgreSQL's
identity column. JSON columns are text the store writes with `json.dumps` and reads back with
`json_column`, so a stored value reads the same on either database.
"""

from __future__ import annotations

import gc
import json
import secrets
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Double,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    and_,
    case,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy import Column as _Column
from sqlalchemy.engine import Result, Row

from pytest_hemra.core.lifecycle import TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import TrialFilter, TrialRecord

SCHEMA_VERSION = 13
OLDEST_MIGRATED = 2  # stores from schema 2 on are brought forward when opened

metadata = MetaData()


def text(name: str, *, key: bool = False) -> _Column[str]:
    return _Column(name, Text, primary_key=key)


def integer(name: str) -> _Column[int]:
    return _Column(name, BigInteger)


def real(name: str) -> _Column[float]:
    return _Column(name, Double)


def row_id() -> _Column[int]:
    """A numbered row: SQLite's rowid, PostgreSQL's identity column."""
    return _Column("id", BigInteger().with_variant(Integer, "sqlite"), Identity(), primary_key=True)


def fresh_revision() -> int:
    """A trial row's revision, drawn at random at each write: the sum over a run's rows then
    changes with any write but with odds of 2**-40, with no counter for writers to share (40
    bits: the sum over a run's rows stays within SQLite's 64-bit integer up to 8 million rows)."""
    return secrets.randbits(40)


meta = Table("meta", metadata, text("key", key=True), text("value"))
runs = Table(
    "runs",
    metadata,
    text("id", key=True),
    text("name"),
    real("created_at"),
    text("status"),
    text("spec"),
    text("trials_dir"),
    integer("schema_version"),
)
trials = Table(
    "trials",
    metadata,
    text("id", key=True),
    text("run_id"),
    integer("seq"),
    integer("plan_seq"),
    text("item_id"),
    text("dataset"),
    text("task"),
    text("harness"),
    integer("attempt"),
    text("replaces"),
    integer("retries"),
    text("status"),
    text("outcome"),
    real("reward"),
    text("rewards"),
    integer("exit_code"),
    text("error"),
    real("started_at"),
    real("finished_at"),
    real("duration"),
    text("phases"),
    text("trial_dir"),
    text("worker"),
    integer("calls"),
    integer("input_tokens"),
    integer("output_tokens"),
    integer("cache_read_tokens"),
    integer("cache_write_tokens"),
    real("cost"),
    integer("cost_known"),  # 0: a call whose usage was read has no price
    integer("usage_unknown"),  # calls whose usage could not be read: the cost is unknown
    text("models"),
    integer("other_model_tokens"),
    text("stopped_by"),
    text("own_report"),
    text("judges"),
    text("error_class"),  # the SWE track's class (`swe_class`)
    text("engine"),
    text("agent_user"),
    text("model"),  # a matrix run's cell model (NULL: the run's one model)
    integer("kept_processes"),  # 1: verified with the agent's processes running
    text("cause"),  # why it ended so beside its outcome (`Cause`); in error_class before 12
    # drawn afresh at each write of the row, by every insert and update the store makes: a
    # run's rows' count and sum of revisions change with any write (`Store.trials_key`)
    _Column("revision", BigInteger, default=fresh_revision, onupdate=fresh_revision),
)
jobs = Table(
    "jobs",
    metadata,
    text("id", key=True),
    text("run_id"),
    text("trial_id"),
    text("state"),
    text("lease_owner"),
    real("lease_expires"),
    real("heartbeat_at"),
    real("created_at"),
)
calls = Table(
    "calls",
    metadata,
    row_id(),
    text("run_id"),
    text("trial_id"),
    real("at"),
    text("provider"),
    text("wire"),
    text("method"),
    text("path"),
    text("model_requested"),
    text("model"),
    integer("status"),
    integer("input_tokens"),
    integer("output_tokens"),
    integer("cache_read_tokens"),
    integer("cache_write_tokens"),
    real("cost"),
    real("latency"),
    real("ttfb"),
    integer("request_bytes"),
    integer("response_bytes"),
    text("error"),
    integer("refused"),
    text("headers"),
    text("role"),
)
calibrations = Table(
    "calibrations",
    metadata,
    row_id(),
    real("at"),
    text("judge"),
    text("model"),
    text("rubric_digest"),
    real("mae"),
    integer("anchors"),
    real("threshold"),
    integer("reliable"),
)
steps = Table(
    "steps",
    metadata,
    row_id(),
    text("run_id"),
    text("trial_id"),
    integer("seq"),
    text("name"),
    real("reward"),
    text("rewards"),
    integer("exit_code"),
    integer("timed_out"),
    real("duration"),
    text("error"),
)
judgments = Table(
    "judgments",
    metadata,
    row_id(),
    text("run_id"),
    text("trial_id"),
    text("judge"),
    real("score"),
    text("rationale"),
    text("error"),
    integer("calls"),
    integer("input_tokens"),
    integer("output_tokens"),
    real("cost"),
    integer("cost_known"),
    real("duration"),
)
placements = Table(
    "placements",
    metadata,
    text("trial_id", key=True),
    text("run_id"),
    text("engine"),
    text("address"),
    text("owner"),
    real("at"),
)
events = Table(
    "events",
    metadata,
    row_id(),
    text("run_id"),
    text("trial_id"),
    real("at"),
    text("kind"),
    text("data"),
)
# jobs a harness kind runs for several trials at once (Harbor's), and their claimed results
shared_jobs = Table(
    "shared_jobs",
    metadata,
    text("id", key=True),
    text("run_id"),
    text("kind"),
    text("name"),
    integer("seq"),
    text("data"),
    real("updated_at"),
)
shared_claims = Table(
    "shared_claims",
    metadata,
    text("id", key=True),
    text("run_id"),
    text("kind"),
    text("result"),
    text("trial_id"),
    real("at"),
)
# a run's report as it was built (`report/snapshot.py`), with the key of what it was built from
reports = Table(
    "reports", metadata, text("run_id", key=True), text("key"), text("body"), real("made_at")
)
# who holds a run's board of one kind while it starts, watches or stops shared jobs
shared_locks = Table(
    "shared_locks", metadata, text("id", key=True), text("owner"), real("expires_at")
)


def index(table: Table, *columns: str) -> Index:
    """An index named as sqlite_utils named them (`idx_trials_run_id_plan_seq_seq`), the
    names stores made before SQLAlchemy carry."""
    return Index(f"idx_{table.name}_{'_'.join(columns)}", *(table.c[c] for c in columns))


INDEXES = (
    index(trials, "run_id", "plan_seq", "seq"),
    index(jobs, "run_id", "state"),
    index(calls, "trial_id"),
    index(trials, "run_id", "status", "outcome"),  # progress counts, read on every viewer poll
    index(shared_jobs, "run_id", "kind", "seq"),
    index(shared_claims, "run_id", "kind"),
    index(events, "kind", "trial_id"),  # trials waiting for an engine, read on every poll
)

# A trial row is current unless a retry or a resume ran it again under a new row (`replaces`).
CURRENT = trials.c.status != TrialStatus.REPLACED
_t = trials.c
# a trial's columns as `TrialRecord` names them, each read by its label
TRIAL_COLUMNS: tuple[ColumnElement[Any], ...] = (
    _t.id,
    _t.run_id,
    _t.seq,
    _t.item_id,
    _t.dataset,
    _t.task,
    _t.harness,
    _t.attempt,
    _t.status,
    _t.outcome,
    _t.reward,
    _t.rewards,
    _t.error,
    _t.duration,
    _t.trial_dir,
    (
        func.coalesce(_t.input_tokens, 0)
        + func.coalesce(_t.output_tokens, 0)
        + func.coalesce(_t.cache_read_tokens, 0)
        + func.coalesce(_t.cache_write_tokens, 0)
    ).label("tokens"),
    case(
        (or_(_t.cost_known == 0, _t.usage_unknown > 0), None), else_=func.coalesce(_t.cost, 0)
    ).label("cost"),
    _t.models,
    func.coalesce(_t.other_model_tokens, 0).label("other_model_tokens"),
    _t.stopped_by,
    _t.own_report,
    _t.replaces,
    func.coalesce(_t.retries, 0).label("retries"),
    _t.exit_code,
    _t.judges,
    _t.error_class.label("swe_class"),
    _t.engine,
    _t.agent_user,
    func.coalesce(_t.calls, 0).label("calls"),
    func.coalesce(_t.usage_unknown, 0).label("usage_unknown"),
    func.coalesce(_t.cost_known, 1).label("is_priced"),
    _t.model,
    func.coalesce(_t.kept_processes, 0).label("kept_processes"),
    _t.cause,
)


def filter_clauses(run_id: str, where: TrialFilter) -> list[ColumnElement[bool]]:
    clauses = [_t.run_id == run_id, CURRENT]
    for column in ("harness", "task", "dataset"):
        value = getattr(where, column)
        if value is not None:
            clauses.append(_t[column] == value)
    if where.outcome in TrialStatus.WITHOUT_OUTCOME:
        clauses.append(and_(_t.status == where.outcome, _t.outcome.is_(None)))
    elif where.outcome is not None:
        clauses.append(_t.outcome == where.outcome)
    if where.text:
        escaped = "".join("\\" + c if c in "\\%_" else c for c in where.text)
        pattern = f"%{escaped}%"
        clauses.append(
            or_(
                _t.item_id.ilike(pattern, escape="\\"),
                func.coalesce(_t.error, "").ilike(pattern, escape="\\"),
            )
        )
    return clauses


def after_trial(trial: str) -> ColumnElement[bool]:
    """Trials after `trial` in plan order: a page's cursor."""
    earlier = trials.alias("earlier")
    at = select(earlier.c.plan_seq, earlier.c.seq).where(earlier.c.id == trial).subquery()
    return tuple_(_t.plan_seq, _t.seq) > select(at).scalar_subquery()


def trial_id(run_id: str, seq: int) -> str:
    return f"{run_id}.{seq:05d}"


EMPTY_JSON = frozenset({"", "{}", "[]", "null"})
OUTCOMES = {str(outcome): outcome for outcome in Outcome}


def json_column(text: str | None) -> Any:
    """A JSON column, with the common empty values read without the parser."""
    return None if text is None or text in EMPTY_JSON else json.loads(text)


class TrialReader:
    """Rows of `TRIAL_COLUMNS` into `TrialRecord`s, each column taken by its name.

    A run's JSON columns repeat from trial to trial (a reward of 1.0 or 0.0, one model, no
    judges): each distinct text is parsed once per reader and copied for each record, which
    is most of what reading 150,000 trials costs otherwise (`benchmarks/store_read.py`)."""

    def __init__(self) -> None:
        self._models: dict[str | None, tuple[str, ...]] = {}
        self._objects: dict[str, dict[str, Any]] = {}

    def _object(self, text: str | None) -> dict[str, Any] | None:
        """A JSON object column: a copy of its parse (records may be changed by their reader)."""
        if text is None or text in EMPTY_JSON:
            return None
        found = self._objects.get(text)
        if found is None:
            found = self._objects[text] = json.loads(text)
        return dict(found)

    def records(self, rows: Result[Any]) -> list[TrialRecord]:
        """Every row of a query of `TRIAL_COLUMNS`, its columns named once for them all. The
        cyclic garbage collector is paused meanwhile: records hold no cycles, and its passes
        over a big run's new objects were a third of the read."""
        names = tuple(rows.keys())
        paused = gc.isenabled()
        gc.disable()
        try:
            return [self._record(zip(names, row, strict=True)) for row in rows]
        finally:
            if paused:
                gc.enable()

    def record(self, row: Row[Any]) -> TrialRecord:
        return self._record(row._asdict().items())

    def _record(self, columns: Iterable[tuple[str, Any]]) -> TrialRecord:
        # every field is a column (checked below), so the record's attributes are filled in
        # place: the frozen __init__'s 34 `object.__setattr__` calls, and a dict of the row
        # made first, were half of a big run's read
        record: TrialRecord = object.__new__(TrialRecord)
        values = record.__dict__
        values.update(columns)
        outcome, models = values["outcome"], values["models"]
        values["outcome"] = None if outcome is None else OUTCOMES[outcome]
        values["rewards"] = self._object(values["rewards"]) or {}
        found = self._models.get(models)
        if found is None:
            found = self._models[models] = tuple(json_column(models) or ())
        values["models"] = found
        values["own_report"] = self._object(values["own_report"])
        values["judges"] = self._object(values["judges"]) or {}
        values["is_priced"] = bool(values["is_priced"])
        values["kept_processes"] = bool(values["kept_processes"])
        return record


if {column.name for column in TRIAL_COLUMNS} != {field.name for field in fields(TrialRecord)}:
    raise TypeError("TRIAL_COLUMNS must name every field of TrialRecord, and only those")


def trial_record(row: Row[Any]) -> TrialRecord:
    """One row of `TRIAL_COLUMNS` as a record."""
    return TrialReader().record(row)
