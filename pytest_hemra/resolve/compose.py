"""A task's `environment/docker-compose.yaml`: Harbor's multi-container tasks, parsed once.

The `main` service is HEMRA's own sandbox (the task image); every other service is the task's
own, started beside it on a network of the trial alone (`execute/sandbox/services.py`). Only
the keys HEMRA acts on are accepted; any other (ports, volumes, networks, privileged, cap_add,
devices, network_mode...) refuses the task at resolve in one line naming the file, the service
and the key. Builds stay inside `environment/`, so the task's environment digest covers them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.env_templates import ENV_NAME, TEMPLATE

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
MAIN = "main"
SERVICE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
DURATION = re.compile(r"(?P<amount>\d+(?:\.\d+)?)(?P<unit>us|ms|s|m|h)")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
Condition = Literal["service_started", "service_healthy", "service_completed_successfully"]
# keys of `main` HEMRA acts on its own way: the sandbox is the task image, started last
MAIN_KEYS = ("build", "image", "depends_on", "environment")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def seconds(value: Any) -> float:
    """A compose duration (`1m30s`, `500ms`, `10s`) or a number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    total, end = 0.0, 0
    for match in DURATION.finditer(text):
        if match.start() != end:
            break
        total += float(match.group("amount")) * UNITS[match.group("unit")]
        end = match.end()
    if not text or end != len(text):
        raise ValueError(f"expected a duration like '10s', '1m30s' or '500ms', got {value!r}")
    return total


def _argv(value: Any) -> Any:
    """`command` / `entrypoint` as an argv list: a string is split as compose splits it, and
    compose's `$$` escape is a `$` (only `environment` values are filled from the runner's)."""
    value = shlex.split(value) if isinstance(value, str) else value
    return [_unescape(part) for part in value] if isinstance(value, list) else value


def _unescape(part: Any) -> Any:
    return part.replace("$$", "$") if isinstance(part, str) else part


class Build(Strict):
    context: str = "."
    dockerfile: str = "Dockerfile"
    args: dict[str, str] = Field(default_factory=dict)

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, value: Any) -> Any:
        return _mapping(value)


class Healthcheck(Strict):
    """Docker compose's form; `test` a string (run by the container's shell) or a list."""

    test: list[str] | str | None = None
    interval: float = 30.0
    timeout: float = 30.0
    retries: int = Field(default=3, ge=1)
    start_period: float = 0.0
    start_interval: float | None = None
    disable: bool = False

    _durations = field_validator(
        "interval", "timeout", "start_period", "start_interval", mode="before"
    )(lambda value: None if value is None else seconds(value))

    @field_validator("test")
    @classmethod
    def _test(cls, value: list[str] | str | None) -> list[str] | str | None:
        value = [_unescape(part) for part in value] if isinstance(value, list) else value
        value = _unescape(value) if isinstance(value, str) else value
        if isinstance(value, list) and (not value or value[0] not in ("CMD", "CMD-SHELL", "NONE")):
            raise ValueError("a list starting with CMD, CMD-SHELL or NONE")
        return value

    @property
    def argv(self) -> list[str] | None:
        """The test as Docker's HEALTHCHECK takes it; None: no check (disabled, NONE)."""
        if self.disable or self.test is None:
            return None
        test = ["CMD-SHELL", self.test] if isinstance(self.test, str) else list(self.test)
        return None if test[0] == "NONE" else test


class Dependency(Strict):
    """A `depends_on` entry. `required: false`: a condition not met is logged and the trial
    goes on (Compose warns and starts the dependent). `restart` is accepted and has nothing
    to do: HEMRA never restarts a service within a trial (and `restart:` policies are refused)."""

    condition: Condition = "service_started"
    required: bool = True
    restart: bool = False


def _mapping(value: Any) -> Any:
    """`environment` / `args` as a list of `NAME=value` or a map; values become text."""
    if isinstance(value, list):
        pairs: dict[str, Any] = {}
        for item in value:
            name, _, rest = str(item).partition("=")
            pairs[name] = rest if "=" in str(item) else ""
        value = pairs
    if isinstance(value, dict):
        return {str(name): _text(item) for name, item in value.items()}
    return value


def _text(item: Any) -> str:
    if item is None:
        return ""
    return str(item).lower() if isinstance(item, bool) else str(item)


def _build_context(value: Any) -> Any:
    """`build: ./api` is `build: {context: ./api}`."""
    return {"context": value} if isinstance(value, str) else value


def _dependencies(value: Any) -> Any:
    """`depends_on: [api]` is `depends_on: {api: {condition: service_started}}`."""
    return {str(name): {} for name in value} if isinstance(value, list) else value


def _environment(value: dict[str, str]) -> dict[str, str]:
    for name, text in value.items():
        if not ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        if "${" in TEMPLATE.sub("", text):
            raise ValueError(f"{name}: {text!r} holds a '${{' that is not ${{VAR}} or ${{VAR:-x}}")
    return value


class Service(Strict):
    """A service beside the sandbox: the task's own, trusted, reached over the trial network."""

    build: Build | None = None
    image: str | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    expose: list[str | int] = Field(default_factory=list)  # every port is open on the network
    healthcheck: Healthcheck | None = None
    depends_on: dict[str, Dependency] = Field(default_factory=dict)
    working_dir: str | None = Field(default=None, pattern=r"^/")
    user: str | int | None = None

    _build = field_validator("build", mode="before")(_build_context)
    _env = field_validator("environment", mode="before")(_mapping)
    _checked_env = field_validator("environment")(_environment)
    _argvs = field_validator("command", "entrypoint", mode="before")(_argv)
    _depends = field_validator("depends_on", mode="before")(_dependencies)

    def needed(self) -> dict[str, Dependency]:
        return self.depends_on


class Main(Strict):
    """`main`: HEMRA's sandbox from the task image; these keys are what Harbor's `main` may say."""

    build: Build | None = None
    image: str | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    depends_on: dict[str, Dependency] = Field(default_factory=dict)

    _build = field_validator("build", mode="before")(_build_context)
    _env = field_validator("environment", mode="before")(_mapping)
    _checked_env = field_validator("environment")(_environment)
    _depends = field_validator("depends_on", mode="before")(_dependencies)

    def needed(self) -> dict[str, Dependency]:
        return self.depends_on


class Compose(Strict):
    """The compose file: `main` (HEMRA's sandbox) and the services started beside it."""

    path: Path
    main: Main = Field(default_factory=Main)
    services: dict[str, Service] = Field(default_factory=dict)

    def order(self) -> list[str]:
        """The services in the order they start: each after every service it depends on."""
        done: list[str] = []
        for name in sorted(self.services):
            self._visit(name, done, ())
        return done

    def _visit(self, name: str, done: list[str], path: tuple[str, ...]) -> None:
        if name in done:
            return
        for needed in sorted(self.services[name].depends_on):
            self._visit(needed, done, (*path, name))
        done.append(name)

    def variables(self) -> dict[str, dict[str, str]]:
        """Each service's environment (and main's), for the resolve checks of `${VAR}`s."""
        return {
            MAIN: self.main.environment,
            **{name: service.environment for name, service in self.services.items()},
        }


def compose_file(environment_dir: Path) -> Path | None:
    """The task's compose file, when it has one (two of them refuse the task)."""
    found = [environment_dir / name for name in COMPOSE_FILES if (environment_dir / name).is_file()]
    if len(found) > 1:
        raise SpecError(f"{found[1]}: a second compose file beside {found[0].name} (keep one)")
    return found[0] if found else None


def load_compose(path: Path, *, has_dockerfile: bool, docker_image: str | None) -> Compose:
    """Parse and check a task's compose file; anything HEMRA cannot act on is a SpecError
    naming the file, the service and the key."""
    import yaml  # here: only a task with a compose file needs it (a worker's import cost)

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SpecError(f"{path}: not valid YAML ({first})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping with 'services'")
    for key in data:
        if key not in ("services", "version", "name"):
            raise SpecError(
                f"{path}: top-level key {str(key)!r} is not supported"
                " (HEMRA reads 'services' alone: no volumes, networks, configs or secrets)"
            )
    services = data.get("services") or {}
    if not isinstance(services, dict):
        raise SpecError(f"{path}: key 'services': expected a mapping of services")
    parsed: dict[str, Service] = {}
    main = Main()
    for name, body in services.items():
        name = str(name)
        where = f"{path}: service {name!r}"
        if not SERVICE_NAME.match(name):
            raise SpecError(f"{where}: not a valid service name (letters, digits, '.', '_', '-')")
        if not isinstance(body, dict):
            raise SpecError(f"{where}: expected a mapping of keys")
        if name == MAIN:
            for key in body:
                if key not in MAIN_KEYS:
                    raise SpecError(
                        f"{where}: key {str(key)!r} is not supported for main, HEMRA's sandbox"
                        f" (it takes {', '.join(MAIN_KEYS)})"
                    )
            main = _validate(Main, body, where)
            continue
        parsed[name] = _validate(Service, body, where)
    compose = Compose(path=path, main=main, services=parsed)
    _check(compose, has_dockerfile=has_dockerfile, docker_image=docker_image)
    return compose


def _validate(model: type[Strict], body: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        if first["type"] == "extra_forbidden":
            raise SpecError(
                f"{where}: key {key!r} is not supported (HEMRA refuses what it cannot keep"
                " inside the trial: no ports, volumes, networks, privileges or devices)"
            ) from None
        message = str(first["msg"]).removeprefix("Value error, ")
        raise SpecError(f"{where}: key {key!r}: {message}") from None


def _check(compose: Compose, *, has_dockerfile: bool, docker_image: str | None) -> None:
    path, folder = compose.path, compose.path.parent.resolve()
    for name, service in compose.services.items():
        where = f"{path}: service {name!r}"
        if service.build is None and not service.image:
            raise SpecError(f"{where}: key 'build' or 'image' is required")
        if service.build is not None:
            _check_build(service.build, folder, where)
        for needed in service.depends_on:
            if needed == MAIN:
                raise SpecError(f"{where}: key 'depends_on': main (the sandbox) starts last")
            if needed not in compose.services:
                raise SpecError(f"{where}: key 'depends_on': no service named {needed!r}")
    where = f"{path}: service 'main'"
    for needed in compose.main.depends_on:
        if needed not in compose.services:
            raise SpecError(f"{where}: key 'depends_on': no service named {needed!r}")
    if compose.main.build is not None:
        build = compose.main.build
        context = (folder / build.context).resolve()
        if (
            context != folder
            or build.dockerfile != "Dockerfile"
            or build.args
            or not has_dockerfile
        ):
            raise SpecError(
                f"{where}: key 'build': main is the task image, built from environment/Dockerfile"
                " without args (context '.')"
            )
    image = compose.main.image
    if image and compose.main.build is None and "${" not in image and image != docker_image:
        raise SpecError(
            f"{where}: key 'image': main is the task image ({docker_image or 'its Dockerfile'}),"
            f" not {image!r}"
        )
    _check_cycles(compose)


def _check_build(build: Build, folder: Path, where: str) -> None:
    """A build context inside `environment/` (so the environment's digest covers it), its
    Dockerfile inside the context."""
    context = (folder / build.context).resolve()
    if context != folder and folder not in context.parents:
        raise SpecError(
            f"{where}: key 'build.context': {build.context!r} is outside the compose file's"
            " folder (environment/)"
        )
    if not context.is_dir():
        raise SpecError(f"{where}: key 'build.context': no folder {build.context!r}")
    dockerfile = (context / build.dockerfile).resolve()
    if context not in dockerfile.parents or not dockerfile.is_file():
        raise SpecError(
            f"{where}: key 'build.dockerfile': no file {build.dockerfile!r} in its context"
        )


def _check_cycles(compose: Compose) -> None:
    state: dict[str, str] = {}

    def visit(name: str) -> None:
        state[name] = "open"
        for needed in compose.services[name].depends_on:
            if state.get(needed) == "open":
                raise SpecError(
                    f"{compose.path}: service {name!r}: key 'depends_on': a cycle through"
                    f" {needed!r}"
                )
            if needed not in state:
                visit(needed)
        state[name] = "done"  # not a lifecycle state: a service visited

    for name in sorted(compose.services):
        if name not in state:
            visit(name)
