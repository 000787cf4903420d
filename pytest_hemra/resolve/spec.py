"""Run files: the pydantic models of every table (parsed once at the edge, `validation.py`),
reading one with the command line's flags applied (`overrides.py`).

Unknown keys and wrong types are errors that name the file, the key and what was expected.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

# HarnessSpec's first home, which harness kinds of one's own import it from (the plug-in API:
# docs/harnesses.md, examples/custom-kind/conftest.py)
from pytest_hemra.resolve.harness_spec import HarnessSpec as HarnessSpec
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.prices import PriceOverride
from pytest_hemra.resolve.validation import (
    Strict,
    check_env_names,
    check_name,
    parse_model,
    read_toml,
)

ENGINE_ADDRESS = re.compile(r"^(unix://(/[^\s]+)|tcp://[^\s/:]+:\d{1,5}|ssh://[^\s/]+)$")


class EngineTLS(Strict):
    """`tls` of a `tcp://` engine: paths (relative ones from the run file's folder)."""

    ca: str | None = None  # the engine's CA: its certificate is verified against it
    cert: str | None = None  # client certificate and key, for an engine that asks for one
    key: str | None = None
    verify: bool = True  # verify the engine's certificate (against `ca`, else the system's)


class EngineSettings(Strict):
    """One Docker engine of `[[sandbox.engines]]`; see docs/scaling.md."""

    address: str
    capacity: int = Field(gt=0, le=1024)
    name: str | None = None
    gateway_host: str | None = None  # the runner's address as this engine's sandboxes see it
    tls: EngineTLS | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str | None) -> str | None:
        return value if value is None else check_name(value)

    @field_validator("address")
    @classmethod
    def _known_address(cls, value: str) -> str:
        if not ENGINE_ADDRESS.match(value):
            raise ValueError(
                "expected unix:///path/docker.sock, tcp://host:port or ssh://[user@]host[:port]"
            )
        return value

    @field_validator("tls")
    @classmethod
    def _tls_over_tcp(cls, value: EngineTLS | None, info: ValidationInfo) -> EngineTLS | None:
        if value is None:
            return value
        if not str(info.data.get("address", "tcp://")).startswith("tcp://"):
            raise ValueError("expected no TLS settings: they are for tcp:// engines only")
        if (value.cert is None) != (value.key is None):
            raise ValueError("expected both 'cert' and 'key', or neither")
        return value

    @property
    def label(self) -> str:
        """The engine's name: given, or its address's host[:port] (a socket: its path)."""
        return self.name or self.address.split("://", 1)[1].rsplit("@", 1)[-1]


class SandboxSettings(Strict):
    provider: str = "docker"
    image: str = Field(
        default="debian:bookworm-slim",
        description="image for tasks whose environment names no Dockerfile or docker_image",
    )
    engines: list[EngineSettings] = Field(default_factory=list)
    # task images built (or found cached) at once at resolve, before anything is recorded
    image_builds: int = Field(default=2, ge=1)
    # every task's sandbox (docs/sandbox.md): defaults for a task that sets none, and ceilings a
    # task's own values may not exceed (refused at resolve, naming the task and its key)
    cpus: float = Field(default=1.0, ge=0.01, allow_inf_nan=False)
    memory_mb: int = Field(default=2048, ge=6)
    disk_mb: int | None = Field(default=None, gt=0)  # storage-opt size: overlay2 on xfs + pquota
    agent_timeout_sec: float = Field(default=900.0, gt=0, allow_inf_nan=False)
    verifier_timeout_sec: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    pids: int = Field(default=1024, gt=0)
    # whose user the agent runs as: "task" (as Harbor: [agent] user, else the image's USER,
    # else root), "non-root" (HEMRA's uid 1000 unless the task's [agent] user names another
    # user that is not root: a run that never runs an agent as root)
    agent_user: Literal["task", "non-root"] = "task"
    # what a trial folder keeps (docs/sandbox.md): of each file a command's output goes to
    # (agent/stdout.txt...: its head and tail, the cut noted), and of the other files the agent
    # controls (its /logs/agent, its artifacts)
    output_cap_mb: int = Field(default=16, ge=1)
    folder_cap_mb: int = Field(default=256, ge=1)
    max_cpus: float = Field(default=8.0, ge=0.01, allow_inf_nan=False)
    max_memory_mb: int = Field(default=16384, ge=6)
    max_pids: int = Field(default=4096, gt=0)
    max_agent_timeout_sec: float = Field(default=6 * 3600.0, gt=0, allow_inf_nan=False)
    max_verifier_timeout_sec: float = Field(default=6 * 3600.0, gt=0, allow_inf_nan=False)
    # the runner's variables a task's env templates (`${VAR}`) may read; no other fills one
    # (resolve/templates.py, docs/run-files.md#what-a-sandbox-sees-of-the-runners-environment)
    pass_env: list[str] = Field(default_factory=list)

    _pass_env = field_validator("pass_env")(check_env_names)

    @field_validator(
        "max_cpus", "max_memory_mb", "max_pids", "max_agent_timeout_sec", "max_verifier_timeout_sec"
    )
    @classmethod
    def _ceiling_over_default(cls, value: float, info: ValidationInfo) -> float:
        default_key = str(info.field_name).removeprefix("max_")
        default = info.data.get(default_key)
        if default is not None and value < default:
            raise ValueError(f"expected at least the default {default_key} ({default:g})")
        return value

    @field_validator("engines")
    @classmethod
    def _distinct_engines(cls, engines: list[EngineSettings]) -> list[EngineSettings]:
        for what, values in (
            ("address", [e.address for e in engines]),
            ("name", [e.label for e in engines]),
        ):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(f"expected each engine {what} once, {twice[0]!r} is repeated")
        return engines


class VerifierSettings(Strict):
    network: Literal["none", "bridge"] = "none"
    env: list[str] = Field(default_factory=list)
    # "separate" runs every task's verifier in a fresh sandbox; a task may ask for it alone
    environment_mode: Literal["shared", "separate"] = "shared"
    # the agent's processes left running for the verifier: true (every task), false (none,
    # whatever a task asks), dataset names or "dataset::task"s (those, and the tasks that ask
    # for it with `[hemra] keep_agent_processes`); unset: as each task asks
    keep_agent_processes: bool | list[str] | None = None
    # a model for the verifier, as judges get one: the gateway's URL and a token of the trial's
    # (HEMRA_BASE_URL, HEMRA_API_KEY), its network only HEMRA's gateway network; never a key
    model_access: bool = False

    _env = field_validator("env")(check_env_names)


class ProviderSettings(Strict):
    """`[providers.<name>]`: where the gateway forwards a provider's calls and which key it uses."""

    base_url: str | None = Field(default=None, pattern=r"^https?://")
    auth: Literal["x-api-key", "bearer"] | None = None
    key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class GatewaySettings(Strict):
    """`[gateway]`: the run's rules for model calls."""

    other_models: Literal["flag", "refuse"] = "flag"
    trial_max_tokens: int | None = Field(default=None, gt=0)
    trial_max_cost_usd: float | None = Field(default=None, gt=0)


class ReportSettings(Strict):
    """`[report]`: how the run's trials are reported (docs/run-files.md)."""

    # the reward.json key that is the headline where a trial's rewards have no `reward` key
    # (before the task's `[hemra] reward_key`): core/reward.py
    reward_key: str | None = Field(default=None, min_length=1, max_length=200)


class JudgeSpec(Strict):
    name: str
    rubric: str | None = None
    model: str | None = None
    command: list[str] | None = None

    _name = field_validator("name")(check_name)


class RunSpec(Strict):
    """Everything a run file can say; see docs/run-files.md."""

    name: str = "run"
    baseline: str | None = None
    harnesses: list[str] = Field(min_length=1)
    datasets: list[str] = Field(min_length=1)
    attempts: int = Field(default=1, ge=1, le=1000)
    concurrency: int = Field(default=1, ge=1, le=1024)
    model: str | None = None
    models: list[str] = Field(default_factory=list)  # several: every harness under each
    timeout_secs: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_infra_retries: int = Field(default=0, ge=0, le=100)
    tasks: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    require: list[str] = Field(default_factory=list)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    verifier: VerifierSettings = Field(default_factory=VerifierSettings)
    judge: list[JudgeSpec] = Field(default_factory=list)
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    report: ReportSettings = Field(default_factory=ReportSettings)
    budget_usd: float | None = Field(default=None, gt=0)
    cell_budget_usd: float | None = Field(default=None, gt=0)  # each harness (x model) cell's
    # harnesses the run trusts to run outside HEMRA's sandbox (a harbor harness): docs/security.md
    trust_unisolated: list[str] = Field(default_factory=list)
    # where trial folders go (relative to the run file's folder); required with a shared store
    trials_dir: str | None = None
    # `[prices."MODEL"]`: USD per million tokens, over the price dataset's (resolve/prices.py)
    prices: dict[str, PriceOverride] = Field(default_factory=dict)

    _name = field_validator("name")(check_name)

    @field_validator("trials_dir")
    @classmethod
    def _trials_dir(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "\0" in value):
            raise ValueError("expected a folder's path")
        return value

    @field_validator("prices")
    @classmethod
    def _priced_models(cls, values: dict[str, PriceOverride]) -> dict[str, PriceOverride]:
        for model in values:
            if not model.strip() or model != model.strip():
                raise ValueError(f"expected a model's name, got {model!r}")
        return values

    @field_validator("harnesses")
    @classmethod
    def _harness_names(cls, values: list[str]) -> list[str]:
        for value in values:
            check_name(value)
        if len(set(values)) != len(values):
            raise ValueError("expected each harness once")
        return values

    @field_validator("trust_unisolated")
    @classmethod
    def _trusted_names(cls, values: list[str]) -> list[str]:
        for value in values:
            check_name(value)
        return values

    @field_validator("tasks", "exclude")
    @classmethod
    def _patterns(cls, values: list[str]) -> list[str]:
        for value in values:
            if "/" in value or "\\" in value or value.startswith(".") or not value:
                raise ValueError(f"expected task name patterns (globs without '/'), got {value!r}")
        return values

    @field_validator("models")
    @classmethod
    def _model_names(cls, values: list[str], info: ValidationInfo) -> list[str]:
        if values and info.data.get("model") is not None:
            raise ValueError("expected 'model' (one) or 'models' (several), not both")
        if len(set(values)) != len(values):
            raise ValueError("expected each model once")
        if any(not value.strip() for value in values):
            raise ValueError("expected model names, got an empty one")
        return values

    @model_validator(mode="before")
    @classmethod
    def _pool_concurrency(cls, data: Any) -> Any:
        """With `[[sandbox.engines]]` and no `concurrency`, as many trials at once as the
        engines' capacities add up to (a capacity that is not a count is refused by its own
        field's check)."""
        if not isinstance(data, dict) or "concurrency" in data:
            return data
        sandbox = data.get("sandbox")
        engines = sandbox.get("engines") if isinstance(sandbox, dict) else None
        if not isinstance(engines, list) or not engines:
            return data
        capacities = [e.get("capacity") if isinstance(e, dict) else None for e in engines]
        counts = [c for c in capacities if type(c) is int and c > 0]
        if len(counts) == len(capacities):
            return {**data, "concurrency": min(sum(counts), 1024)}
        return data

    @property
    def is_matrix(self) -> bool:
        """Several models: every harness runs under each (a cell is a harness x model pair)."""
        return len(self.models) > 1

    @property
    def baseline_harness(self) -> str:
        """`baseline` when it names a harness (or a `harness@model` pair), else the first."""
        name = (self.baseline or "").partition("@")[0]
        return name if name in self.harnesses else self.harnesses[0]

    @property
    def baseline_model(self) -> str | None:
        """A matrix's baseline model: `baseline` when it names a model (or a `harness@model`
        pair: harness names hold no '@', model names may), else the first of `models`; the one
        model otherwise."""
        if not self.is_matrix:
            return self.model
        baseline = self.baseline or ""
        harness, at, model = baseline.partition("@")
        if at and harness in self.harnesses and model in self.models:
            return model
        return baseline if baseline in self.models else self.models[0]


def load_run_spec(path: Path | None, overrides: Overrides) -> RunSpec:
    """Read a run file (or none: flags alone) and apply the flags."""
    data = read_toml(path) if path is not None else {}
    source = str(path) if path is not None else "command line"
    spec = parse_model(RunSpec, overrides.apply(data), source, "run setting")
    return _with_engine_paths(spec, path.resolve().parent) if path is not None else spec


def _with_engine_paths(spec: RunSpec, base_dir: Path) -> RunSpec:
    """TLS paths of `[[sandbox.engines]]` made absolute (from the run file's folder), so every
    process reads the same files from the recorded spec."""
    if not any(engine.tls for engine in spec.sandbox.engines):
        return spec

    def absolute(value: str | None) -> str | None:
        return None if value is None else str(base_dir / Path(value).expanduser())

    engines = [
        engine
        if engine.tls is None
        else engine.model_copy(
            update={
                "tls": engine.tls.model_copy(
                    update={
                        "ca": absolute(engine.tls.ca),
                        "cert": absolute(engine.tls.cert),
                        "key": absolute(engine.tls.key),
                    }
                )
            }
        )
        for engine in spec.sandbox.engines
    ]
    sandbox = spec.sandbox.model_copy(update={"engines": engines})
    return spec.model_copy(update={"sandbox": sandbox})
