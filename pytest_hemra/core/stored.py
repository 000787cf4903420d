"""The run's plan as the store keeps it, read back as plain typed values.

`resolve.plan.Plan.record()` writes it with the run (`RunRecord.spec`, schema_version 1):

    {"schema_version": 1, "source": "run.toml",
     "spec": {...the RunSpec's settings...},
     "prices": "genai-prices 0.2.3; run file for MODEL",
     "harnesses": {name: {"path", "digest", "spec": {...the harness file...}, "metered"?,
                          "isolated"?}},
     "datasets": {name: {"path", "digest", "tasks": [...]}},
     "judges": [{"name", "rubric", "model", "command"}]}

`StoredPlan.read` is what every reader (reports, the viewer, the CLI) goes through instead of
indexing that dict. It is forgiving on purpose: a key that is missing reads as its default, so
a run recorded by an older HEMRA or by a test with a partial plan still reads. The runner, which
must rebuild the harness files and the run spec exactly, parses them with pydantic in
`resolve.plan.load_recorded`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

# its agent calls the model directly, not through HEMRA's gateway, and runs in Harbor's own
# containers, not HEMRA's sandbox: how a plan recorded before `metered`/`isolated` reads
UNMETERED_KIND = "harbor"


@dataclass(frozen=True)
class StoredHarness:
    name: str
    digest: str | None = None
    path: str | None = None
    kind: str | None = None
    metered: bool = True  # its model calls go through the gateway, which counts their tokens
    isolated: bool = True  # its agent ran in HEMRA's sandbox (False: trusted by the run)
    settings: Mapping[str, Any] = field(default_factory=dict)  # the harness file, as recorded

    @classmethod
    def read(cls, name: str, entry: Mapping[str, Any]) -> StoredHarness:
        settings = _mapping(entry.get("spec"))
        kind = _text(settings.get("kind"))
        metered = entry.get("metered")
        isolated = entry.get("isolated")
        return cls(
            name=name,
            digest=_text(entry.get("digest")),
            path=_text(entry.get("path")),
            kind=kind,
            metered=metered if isinstance(metered, bool) else kind != UNMETERED_KIND,
            isolated=isolated if isinstance(isolated, bool) else kind != UNMETERED_KIND,
            settings=settings,
        )


@dataclass(frozen=True)
class StoredDataset:
    name: str
    digest: str | None = None
    path: str | None = None
    tasks: tuple[str, ...] = ()
    build_secs: Mapping[str, float] = field(default_factory=dict)  # image builds at resolve
    reward_keys: Mapping[str, str] = field(default_factory=dict)  # tasks' `[hemra] reward_key`

    @classmethod
    def read(cls, name: str, entry: Mapping[str, Any]) -> StoredDataset:
        builds = _mapping(entry.get("build_secs"))
        keys = _mapping(entry.get("reward_keys"))
        return cls(
            name=name,
            digest=_text(entry.get("digest")),
            path=_text(entry.get("path")),
            tasks=tuple(str(t) for t in entry.get("tasks") or ()),
            build_secs={str(k): float(v) for k, v in builds.items() if isinstance(v, int | float)},
            reward_keys={str(k): v for k, v in keys.items() if isinstance(v, str) and v},
        )


@dataclass(frozen=True)
class StoredJudge:
    name: str
    rubric: str = ""
    model: str | None = None  # None: a program judge
    command: tuple[str, ...] | None = None

    @classmethod
    def read(cls, entry: Mapping[str, Any]) -> StoredJudge:
        command = entry.get("command")
        return cls(
            name=str(entry.get("name", "")),
            rubric=str(entry.get("rubric") or ""),
            model=_text(entry.get("model")),
            command=tuple(str(part) for part in command) if command else None,
        )

    @property
    def rubric_digest(self) -> str:
        return hashlib.sha256(self.rubric.encode()).hexdigest()


@dataclass(frozen=True)
class StoredPlan:
    """What a run was recorded to do: its harnesses (in the run's order), datasets, judges and
    the settings readers compare runs by."""

    schema_version: int | None = None
    source: str | None = None
    harness_names: tuple[str, ...] = ()  # the run's order; the baseline need not come first
    baseline: str | None = None  # the run's baseline harness, else its first harness
    model: str | None = None
    models: tuple[str, ...] = ()  # a matrix run's: every harness ran under each
    baseline_model: str | None = None  # a matrix run's baseline model, else the first
    attempts: int | None = None
    timeout_secs: float | None = None
    harnesses: Mapping[str, StoredHarness] = field(default_factory=dict)
    datasets: Mapping[str, StoredDataset] = field(default_factory=dict)
    judges: tuple[StoredJudge, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)  # the run spec, as recorded
    prices: str | None = None  # where its costs came from (resolve/prices.py `price_source`)

    @classmethod
    def read(cls, record: Mapping[str, Any]) -> StoredPlan:
        settings = _mapping(record.get("spec"))
        names = tuple(str(h) for h in settings.get("harnesses") or ())
        version = record.get("schema_version")
        attempts = settings.get("attempts")
        timeout = settings.get("timeout_secs")
        models = tuple(str(m) for m in settings.get("models") or ())
        baseline, baseline_model = _baselines(_text(settings.get("baseline")), names, models)
        return cls(
            schema_version=version if isinstance(version, int) else None,
            source=_text(record.get("source")),
            harness_names=names,
            baseline=baseline,
            model=_text(settings.get("model")),
            models=models if len(models) > 1 else (),
            baseline_model=baseline_model,
            attempts=attempts if isinstance(attempts, int) else None,
            timeout_secs=timeout if isinstance(timeout, int | float) else None,
            harnesses={
                name: StoredHarness.read(name, _mapping(entry))
                for name, entry in _mapping(record.get("harnesses")).items()
            },
            datasets={
                name: StoredDataset.read(name, _mapping(entry))
                for name, entry in _mapping(record.get("datasets")).items()
            },
            judges=tuple(StoredJudge.read(_mapping(j)) for j in record.get("judges") or ()),
            settings=settings,
            prices=_text(record.get("prices")),
        )

    @property
    def ordered_harnesses(self) -> list[str]:
        """The baseline first, then the other harnesses in the run's order."""
        if self.baseline is None:
            return list(self.harness_names)
        return [self.baseline, *(h for h in self.harness_names if h != self.baseline)]

    @cached_property
    def run_reward_key(self) -> str | None:
        """The run file's `[report] reward_key`: the headline where `reward` is missing."""
        return _text(_mapping(self.settings.get("report")).get("reward_key"))

    def reward_keys(self, dataset: str, task: str) -> tuple[str, ...]:
        """The keys named as a task's headline, the run's before the task's (as the trial
        was scored: `core.reward.headline_key`)."""
        entry = self.datasets.get(dataset)
        named = (self.run_reward_key, entry.reward_keys.get(task) if entry else None)
        return tuple(key for key in named if key is not None)

    @property
    def unmetered(self) -> frozenset[str]:
        """The harnesses whose tokens the gateway cannot count."""
        return frozenset(name for name, h in self.harnesses.items() if not h.metered)

    @property
    def unisolated(self) -> frozenset[str]:
        """The harnesses whose agents ran outside HEMRA's sandbox (trusted by the run)."""
        return frozenset(name for name, h in self.harnesses.items() if not h.isolated)


def _baselines(
    baseline: str | None, harnesses: tuple[str, ...], models: tuple[str, ...]
) -> tuple[str | None, str | None]:
    """The baseline harness and (a matrix run's) baseline model `baseline` names: a harness, a
    model, or a `harness@model` pair (as `RunSpec.baseline_harness` / `baseline_model`)."""
    harness, at, model = (baseline or "").partition("@")
    if not harnesses:  # a partial plan (an old run, a test's): the baseline as written
        return baseline, None
    found_harness = harness if harness in harnesses else harnesses[0]
    if len(models) < 2:
        return found_harness, None
    if at and harness in harnesses and model in models:
        return found_harness, model
    return found_harness, baseline if baseline in models else models[0]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
