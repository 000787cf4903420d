"""A task's healthcheck (`[environment] healthcheck`, a step's), with Docker HEALTHCHECK's
semantics: the command (`sh -c`, as root, in the work folder) runs until it passes; during the
start period a failure does not count and checks come every `start_interval_sec`, after it every
`interval_sec`; `retries` failures in a row make the sandbox unhealthy, an infra_error."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import ROOT_USER, Sandbox
from pytest_hemra.resolve.taskconfig import Healthcheck


def wait_healthy(
    sandbox: Sandbox,
    check: Healthcheck,
    *,
    env: Mapping[str, str],
    workdir: str,
    log: Path,
    where: str,
) -> int:
    """Return once `check` passes (the number of checks it took); raise InfraError naming
    `where` when it fails `retries` times in a row after its start period."""
    started = time.monotonic()
    failures = checks = 0
    while True:
        checks += 1
        result = sandbox.exec(
            ["sh", "-c", check.command],
            user=ROOT_USER,
            env=dict(env),
            timeout=check.timeout_sec,
            stdout=log,
            stderr=log,
            workdir=workdir,
        )
        if result.exit_code == 0 and not result.timed_out:
            return checks
        starting = time.monotonic() - started < check.start_period_sec
        if not starting:
            failures += 1
            if failures >= check.retries:
                tail = log.read_text(errors="replace").strip()[-200:] if log.is_file() else ""
                raise InfraError(
                    f"{where}: healthcheck failed {failures} times in a row"
                    f" ({'timed out' if result.timed_out else f'exit {result.exit_code}'}"
                    f"{': ' + tail if tail else ''})"
                )
        time.sleep(check.start_interval_sec if starting else check.interval_sec)
