"""task.toml: Harbor's task format, schema versions 1.0 to 1.4, and HEMRA's `[hemra]` table
(`hemra_table.py`); the `${VAR}` templates of its env tables are `env_templates.py`'s.

Every key Harbor defines is either honoured or refused by name when the task is loaded (a value
HEMRA cannot act on: a Windows task, GPUs); a key nobody defines is kept as a
warning naming it (`unknown_keys`), never dropped in silence. docs/datasets.md has the table of
every key and what HEMRA does with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pytest_hemra.resolve.allowlist import normalize_hosts
from pytest_hemra.resolve.env_templates import check_env
from pytest_hemra.resolve.hemra_table import HemraTask

SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
NetworkMode = Literal["public", "no-network", "allowlist"]
NOT_YET = "HEMRA does not support it yet"


class Harbor(BaseModel):
    """A table of task.toml: keys Harbor defines are typed; others are kept for the warning."""

    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)


def _check_hosts(value: list[str] | None) -> list[str] | None:
    """`allowed_hosts` in Harbor's normal form (`allowlist.normalize_host`)."""
    return None if value is None else normalize_hosts(value)


def _implied_allowlist(data: Any) -> Any:
    """`allowed_hosts` without `network_mode` means `network_mode = "allowlist"`."""
    if isinstance(data, dict) and data.get("allowed_hosts") and "network_mode" not in data:
        data = {**data, "network_mode": "allowlist"}
    return data


def _hosts_need_allowlist(model: Any) -> Any:
    """An allowlist names its hosts; hosts belong to an allowlist."""
    if model.network_mode == "allowlist" and not model.allowed_hosts:
        raise ValueError("network_mode 'allowlist' needs allowed_hosts (the hosts it may reach)")
    if model.allowed_hosts and model.network_mode != "allowlist":
        raise ValueError(f"allowed_hosts with network_mode {model.network_mode!r}: drop one")
    return model


def _check_user(value: str | int | None) -> str | int | None:
    """A user as `[agent] user` / `[verifier] user` take it: a name or uid, with an optional
    ":gid"."""
    if isinstance(value, str) and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:\d+)?$", value):
        raise ValueError(f"expected a user name or uid, got {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"expected a user name or uid, got {value!r}")
    return value


class Healthcheck(Harbor):
    """Docker HEALTHCHECK semantics: `command` (sh -c) until it passes, before the agent."""

    command: str = Field(min_length=1)
    interval_sec: float = Field(default=5.0, gt=0)
    timeout_sec: float = Field(default=30.0, gt=0)
    start_period_sec: float = Field(default=0.0, ge=0)
    start_interval_sec: float = Field(default=5.0, gt=0)
    retries: int = Field(default=3, ge=1)


class TaskAgent(Harbor):
    timeout_sec: float | None = Field(default=None, gt=0)
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None

    _user = field_validator("user")(_check_user)

    _hosts = field_validator("allowed_hosts")(_check_hosts)
    _implied = model_validator(mode="before")(_implied_allowlist)
    _paired = model_validator(mode="after")(_hosts_need_allowlist)


class Continuous(Harbor):
    enabled: bool = False

    @field_validator("enabled")
    @classmethod
    def _off(cls, enabled: bool) -> bool:
        if enabled:
            raise ValueError(f"continuous verification during the agent's turn: {NOT_YET}")
        return enabled


class TaskVerifier(Harbor):
    timeout_sec: float = Field(default=120.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None
    # "separate": the verifier runs in a fresh sandbox with the agent's /app copied in; unset:
    # "separate" with an `[verifier.environment]`, else "shared" (Harbor's rule)
    environment_mode: Literal["shared", "separate"] | None = None
    # the separate room's own environment (the schema of `[environment]`), built from tests/
    environment: TaskEnvironment | None = None
    continuous: Continuous = Field(default_factory=Continuous)
    collect: list[dict[str, Any]] = Field(default_factory=list)

    _env = field_validator("env")(check_env)

    _user = field_validator("user")(_check_user)

    @model_validator(mode="before")
    @classmethod
    def _room(cls, data: Any) -> Any:
        """An `[verifier.environment]` implies the separate room; with 'shared' it is refused."""
        if isinstance(data, dict) and data.get("environment") is not None:
            if data.get("environment_mode") == "shared":
                raise ValueError(
                    "environment_mode = 'shared' with a [verifier.environment]: expected"
                    " 'separate' (or no environment_mode), as Harbor"
                )
            data = {**data, "environment_mode": "separate"}
        return data

    @field_validator("collect")
    @classmethod
    def _no_collect(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if value:
            raise ValueError(f"collect hooks run in compose services, which {NOT_YET}")
        return value

    _hosts = field_validator("allowed_hosts")(_check_hosts)
    _implied = model_validator(mode="before")(_implied_allowlist)
    _paired = model_validator(mode="after")(_hosts_need_allowlist)


def _size_mb(text: str) -> int:
    size = text.strip().upper()
    units = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not size or size[-1] not in units:
        raise ValueError(f"expected a size like '512M' or '2G', got {text!r}")
    return int(float(size[:-1]) * units[size[-1]])


class McpServer(Harbor):
    """One `[[environment.mcp_servers]]`: an MCP server handed to the agent. `stdio`: the agent
    starts `command` with `args` in the sandbox; `sse` / `streamable-http` (`http`): it
    connects to `url` (a service of the task's, say)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    transport: Literal["stdio", "sse", "streamable-http"] = "sse"
    url: str | None = Field(default=None, pattern=r"^https?://")
    command: str | None = None
    args: list[str] = Field(default_factory=list)

    @field_validator("transport", mode="before")
    @classmethod
    def _http(cls, value: Any) -> Any:
        return "streamable-http" if value == "http" else value

    @model_validator(mode="after")
    def _fields_of_transport(self) -> McpServer:
        if self.transport == "stdio" and not self.command:
            raise ValueError("'command' is required for transport 'stdio'")
        if self.transport != "stdio" and not self.url:
            raise ValueError(f"'url' is required for transport '{self.transport}'")
        return self


class TaskEnvironment(Harbor):
    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: str | None = None
    os: Literal["linux", "windows"] = "linux"
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    storage_mb: int | None = Field(default=None, gt=0)
    gpus: int | None = Field(default=None, ge=0)
    gpu_types: list[str] | None = None
    tpu: dict[str, Any] | None = None
    pids_limit: int = Field(default=1024, gt=0)  # HEMRA's own
    allow_internet: bool = True
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None
    mcp_servers: list[McpServer] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    skills_dir: str | None = Field(default=None, pattern=r"^/")  # in the image
    healthcheck: Healthcheck | None = None
    workdir: str | None = Field(default=None, pattern=r"^/")

    _env = field_validator("env")(check_env)

    @model_validator(mode="before")
    @classmethod
    def _deprecated_sizes(cls, data: Any) -> Any:
        """Harbor's older `memory = "2G"` and `storage = "10G"`, as `memory_mb` / `storage_mb`."""
        if isinstance(data, dict):
            data = dict(data)
            for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
                if isinstance(data.get(old), str):
                    data.setdefault(new, _size_mb(data.pop(old)))
        return data

    @field_validator("os", mode="before")
    @classmethod
    def _linux(cls, value: Any) -> Any:
        value = value.lower() if isinstance(value, str) else value
        if value == "windows":
            raise ValueError("HEMRA runs Linux containers only; a Windows task cannot run here")
        return value

    @field_validator("gpus")
    @classmethod
    def _no_gpus(cls, value: int | None) -> int | None:
        if value:
            raise ValueError(f"{value} GPUs asked for: no sandbox provider of HEMRA offers GPUs")
        return value

    @field_validator("tpu")
    @classmethod
    def _no_tpu(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            raise ValueError("a TPU asked for: no sandbox provider of HEMRA offers TPUs")
        return value

    @field_validator("mcp_servers")
    @classmethod
    def _distinct_mcp(cls, value: list[McpServer]) -> list[McpServer]:
        names = [server.name for server in value]
        if len(set(names)) != len(names):
            raise ValueError("two MCP servers share a name")
        return value

    _hosts = field_validator("allowed_hosts")(_check_hosts)
    _implied = model_validator(mode="before")(_implied_allowlist)
    _paired = model_validator(mode="after")(_hosts_need_allowlist)

    @property
    def has_internet(self) -> bool:
        """The baseline policy: `network_mode` when set, else `allow_internet` (an allowlist
        has no route out: its hosts are reached through HEMRA's egress proxy)."""
        if self.network_mode is not None:
            return self.network_mode == "public"
        return self.allow_internet


class TaskSolution(Harbor):
    env: dict[str, str] = Field(default_factory=dict)

    _env = field_validator("env")(check_env)


class PackageInfo(Harbor):
    """`[task]`: the task's package name and description in Harbor's registry (kept, shown)."""

    name: str
    version: str | None = None
    description: str = ""
    authors: list[dict[str, Any]] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class TaskArtifact(Harbor):
    """One `artifacts` entry in its table form: `{ source = "/abs/path", ... }`."""

    source: str
    destination: str | None = None
    exclude: list[str] = Field(default_factory=list)
    service: str | None = None

    @field_validator("service")
    @classmethod
    def _main_only(cls, value: str | None) -> str | None:
        if value not in (None, "main"):
            raise ValueError(f"artifacts of compose service {value!r}: {NOT_YET}")
        return value

    @field_validator("destination")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        if value is not None and (
            value.startswith("/") or ".." in value.split("/") or "\\" in value
        ):
            raise ValueError(f"expected a relative path without '..', got {value!r}")
        return value


def _absolute(entries: list[str | TaskArtifact]) -> list[str | TaskArtifact]:
    for entry in entries:
        path = entry if isinstance(entry, str) else entry.source
        if not path.startswith("/") or ".." in path.split("/") or path.rstrip("/") == "":
            raise ValueError(f"expected an absolute path without '..', got {path!r}")
    return entries


class TaskStep(Harbor):
    """One `[[steps]]` entry (Harbor's multi-step tasks): `steps/<name>/instruction.md`, an
    optional `steps/<name>/tests/` over the task's `tests/`, `steps/<name>/solution/`, and
    `steps/<name>/workdir/` (copied into the work folder) with its `setup.sh` (run as root)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
    agent: TaskAgent = Field(default_factory=TaskAgent)
    verifier: TaskVerifier = Field(default_factory=TaskVerifier)
    min_reward: float | dict[str, float] | None = None
    healthcheck: Healthcheck | None = None
    artifacts: list[str | TaskArtifact] = Field(default_factory=list)

    _artifacts = field_validator("artifacts")(_absolute)

    def falls_short(self, rewards: dict[str, float], reward: float | None) -> bool:
        """Whether this step's rewards miss its `min_reward` (a missing one counts as -inf)."""
        if self.min_reward is None:
            return False
        if isinstance(self.min_reward, dict):
            return any(
                rewards.get(key, float("-inf")) < floor for key, floor in self.min_reward.items()
            )
        return (reward if reward is not None else float("-inf")) < self.min_reward


class TaskConfig(Harbor):
    schema_version: str = "1.0"
    task: PackageInfo | None = None
    source: str | None = None
    # Harbor's declared artifacts: collected into the trial folder after the agent; a separate
    # verifier room receives them beside /app
    artifacts: list[str | TaskArtifact] = Field(default_factory=list)
    steps: list[TaskStep] = Field(default_factory=list)
    multi_step_reward_strategy: Literal["mean", "final"] = "mean"
    hemra: HemraTask = Field(default_factory=HemraTask)
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent: TaskAgent = Field(default_factory=TaskAgent)
    verifier: TaskVerifier = Field(default_factory=TaskVerifier)
    environment: TaskEnvironment = Field(default_factory=TaskEnvironment)
    solution: TaskSolution = Field(default_factory=TaskSolution)

    _artifacts = field_validator("artifacts")(_absolute)

    @model_validator(mode="before")
    @classmethod
    def _version_renamed(cls, data: Any) -> Any:
        """Harbor's schema 1.0 called it `version`."""
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            data.setdefault("schema_version", str(data.pop("version")))
        return data

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value not in SCHEMA_VERSIONS:
            raise ValueError(f"expected one of {', '.join(SCHEMA_VERSIONS)} (Harbor's schemas)")
        return value

    @property
    def agent_network(self) -> NetworkMode:
        """The agent phase's policy: `[agent] network_mode` when set, else the baseline."""
        if self.agent.network_mode is not None:
            return self.agent.network_mode
        environment = self.environment
        if environment.network_mode is not None:
            return environment.network_mode
        return "public" if environment.allow_internet else "no-network"

    @property
    def agent_hosts(self) -> tuple[str, ...]:
        """The hosts the agent may reach through the egress proxy (its phase's allowlist)."""
        if self.agent_network != "allowlist":
            return ()
        policy = self.agent if self.agent.network_mode is not None else self.environment
        return tuple(policy.allowed_hosts or ())

    @property
    def uses_proxy(self) -> bool:
        """Whether a phase reaches hosts through the egress proxy: the agent's, or a verifier's
        (the task's or a step's) with its own allowlist."""
        verifiers = [self.verifier, *(step.verifier for step in self.steps)]
        return bool(self.agent_hosts) or any(v.network_mode == "allowlist" for v in verifiers)

    @property
    def artifact_paths(self) -> list[str]:
        return [(e if isinstance(e, str) else e.source).rstrip("/") for e in self.artifacts]


def unknown_keys(model: BaseModel, prefix: str = "") -> Iterator[str]:
    """Dotted names of every key under `model` that no table defines (kept as extras)."""
    for key in sorted(model.model_extra or {}):
        yield prefix + key
    for name in type(model).model_fields:
        value = getattr(model, name)
        values = value if isinstance(value, list) else [value]
        for index, item in enumerate(values):
            if isinstance(item, Harbor):
                where = f"{name}[{index}]" if isinstance(value, list) else name
                yield from unknown_keys(item, f"{prefix}{where}.")
