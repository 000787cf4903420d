"""The `harbor` harness kind: Harbor itself runs the harness's trials, supervised by HEMRA.

A harbor harness names Harbor's agent (`agent = "oracle"`) and the Harbor release
(`package = "pypi:harbor==0.26.0"`), and nothing that only HEMRA's own sandbox would use.
Installing it builds Harbor's runner image (`image.py`); its trials are Harbor jobs
(`job.py`) coordinated through the store (`trials.py`) and imported from Harbor's results
(`result.py`). Its agents call their models directly: the gateway does not count them. It is
trusted-only: a run names it in `trust_unisolated` or is refused at resolve (resolve/plan.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from pytest_hemra.core.cache import cache_root
from pytest_hemra.core.errors import InfraError, SpecError
from pytest_hemra.core.progress import Progress
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.trial import TrialResult
from pytest_hemra.execute.context import TrialContext
from pytest_hemra.execute.installs import (
    MARKER,
    SYSTEM_PATH,
    Installed,
    install_dir,
    locked,
)
from pytest_hemra.execute.kinds import AgentTurn
from pytest_hemra.execute.sandbox import ExecResult, SandboxProvider
from pytest_hemra.resolve.harnesses import Harness
from pytest_hemra.resolve.plan import RecordedRun
from pytest_hemra.resolve.spec import HarnessSpec, RunSpec
from pytest_hemra.store import Store

HARBOR_PACKAGE = re.compile(r"^pypi:harbor==[A-Za-z0-9.+!-]+$")
# keys that say how HEMRA runs an agent in its own sandbox: Harbor runs its agent itself
NOT_FOR_HARBOR = (
    "command", "install", "provider", "key_env", "uses_solution", "environment", "files",
    "output", "entry", "finish_command", "edit_format",
)  # fmt: skip


def harbor_version(harness: Harness) -> str:
    """The Harbor release a harbor harness names: `package = "pypi:harbor==<version>"`."""
    return (harness.spec.package or "").partition("==")[2]


class HarborKind:
    """Trials run by `harbor run` in Harbor's own containers; HEMRA imports their results."""

    calls_models = False  # none that the gateway sees
    is_metered = False
    # Harbor's runner gets the Docker socket (root on the runner's engine) and starts its own
    # containers without HEMRA's hardening: a run must trust the harness (`trust_unisolated`)
    is_isolated = False

    def validate(self, path: Path, spec: HarnessSpec) -> None:
        if not spec.agent:
            raise SpecError(
                f"{path}: key 'agent' is required for a harbor harness (the Harbor agent to run,"
                ' e.g. "oracle")'
            )
        if spec.package is None or not HARBOR_PACKAGE.match(spec.package):
            got = "" if spec.package is None else f", got {spec.package!r}"
            raise SpecError(
                f"{path}: key 'package': a harbor harness names the Harbor release it runs,"
                f' e.g. "pypi:harbor==0.26.0"{got}'
            )
        for key in NOT_FOR_HARBOR:
            if getattr(spec, key):
                raise SpecError(
                    f"{path}: key {key!r} does not apply to a harbor harness (Harbor runs agent"
                    f" {spec.agent!r} in its own container)"
                )

    def check_run(
        self, harness: Harness, run: RunSpec, source: str, provider: SandboxProvider
    ) -> None:
        if run.sandbox.engines:
            raise SpecError(
                f"{harness.path}: a harbor harness runs in Harbor's own docker environment on the"
                f" runner's engine, but the run ({source}) spreads over 'sandbox.engines'"
            )
        if "docker" not in provider.capabilities:
            raise SpecError(
                f"{harness.path}: a harbor harness runs in Harbor's own docker environment, but "
                f"the run's sandbox provider {provider.name!r} ({source}) is not docker's"
            )

    def install(self, harness: Harness) -> Installed:
        """Nothing goes into sandboxes: Harbor runs in a runner image of its own, built once
        per Harbor release (image.py); the install's marker names the image."""
        from pytest_hemra.execute.kinds.harbor.image import build_runner_image, has_runner_image

        version = harbor_version(harness)
        directory = install_dir(harness)
        directory.parent.mkdir(parents=True, exist_ok=True)
        with locked(directory.with_suffix(".lock"), f"Harbor {version}"):
            if not ((directory / MARKER).is_file() and has_runner_image(version)):
                directory.mkdir(exist_ok=True)
                try:
                    with Progress(f"installing harness {harness.name} (Harbor {version}'s image)"):
                        tag = build_runner_image(version, cache_root() / "harbor")
                except InfraError as error:
                    raise InfraError(
                        f"{harness.path}: installing {harness.spec.package}: {error}"
                    ) from None
                (directory / MARKER).write_text(tag + "\n")
        return Installed(directory, (), SYSTEM_PATH)

    def is_installed(self, harness: Harness) -> bool:
        from pytest_hemra.execute.kinds.harbor.image import has_runner_image

        marked = (install_dir(harness) / MARKER).is_file()
        return marked and has_runner_image(harbor_version(harness))

    def run_agent(self, turn: AgentTurn) -> ExecResult:
        raise InfraError(f"{turn.harness.path}: a harbor harness's agent runs only under Harbor")

    def run_trial(
        self, context: TrialContext, run: RecordedRun, store: Store, trial: TrialRecord
    ) -> TrialResult:
        from pytest_hemra.execute.kinds.harbor.trials import run_harbor_trial

        return run_harbor_trial(context, run, store, trial)
