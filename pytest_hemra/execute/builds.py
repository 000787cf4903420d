"""Task images built at resolve: every distinct task environment a run needs, built (or found
cached) by its sandbox provider before anything is recorded, `[sandbox] image_builds` at once.

A broken Dockerfile (or a named image the engine lacks) refuses the run in one line instead of
failing each of its trials; the trials then find their images cached (`prepare` again: a few
Docker API calls). Every build is waited for, so one refusal names every task that failed, and
the images that built are cached for the next run.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable

from pytest_hemra.core.errors import HemraError, InfraError, SpecError
from pytest_hemra.core.progress import Progress
from pytest_hemra.execute.kinds import kind_of
from pytest_hemra.execute.sandbox import SandboxProvider
from pytest_hemra.resolve.datasets import Task
from pytest_hemra.resolve.plan import Plan
from pytest_hemra.resolve.verifier_environment import verifier_task

BUILD_MARGIN_SECS = 120.0  # beyond the builds' own timeouts: the engine's start and locks


def tasks_to_build(plan: Plan) -> list[Task]:
    """One task for each distinct environment of the selected tasks, in plan order; none when
    no harness runs in HEMRA's sandbox (a harbor harness builds its own images)."""
    if not any(kind_of(harness).is_isolated for harness in plan.harnesses):
        return []
    found: dict[str, Task] = {}
    for dataset in plan.datasets:
        for task in dataset.tasks:
            found.setdefault(task.environment_digest(), task)
    return list(found.values())


def build_images(
    plan: Plan, provider: SandboxProvider, note: Callable[[str], None] = lambda line: None
) -> None:
    """Build (or find cached) every task image of the plan, `image_builds` at once; a failure is
    one SpecError naming the first failing task with its build's last lines, and the others."""
    tasks = tasks_to_build(plan)
    if not tasks:
        return
    default_image = plan.spec.sandbox.image
    at_once = min(plan.spec.sandbox.image_builds, len(tasks))
    missing = getattr(provider, "missing_images", None)
    if missing is not None:
        count = sum(1 for task in tasks if missing(task, default_image))
        if count:
            note(f"hemra: building {count} task image{'s' * (count != 1)} ({at_once} at once)")
    to_build = {
        task.environment_digest() for task in tasks if missing and missing(task, default_image)
    }
    progress = Progress("task images", total=len(to_build), unit="built")  # n of N, as each ends

    def finished(task: Task) -> None:
        if task.environment_digest() in to_build:
            progress.advance(detail=task.name)

    with progress if to_build else contextlib.nullcontext():
        outcomes = _prepare_all(provider, tasks, default_image, at_once, finished)
    built = {
        task.environment_digest(): secs
        for task, (_, secs) in zip(tasks, outcomes, strict=True)
        if task.environment_digest() in to_build
    }
    for dataset in plan.datasets:  # what each task's image took, recorded with the run
        for task in dataset.tasks:
            if task.environment_digest() in built:
                plan.build_secs[f"{dataset.name}/{task.name}"] = built[task.environment_digest()]
    failures = [failure for failure, _ in outcomes if failure]
    if failures:
        first, others = failures[0], failures[1:]
        also = f"; {len(others)} more failed: " + ", ".join(path for path, _ in others)
        raise SpecError(f"{first[1]}{also if others else ''}")


def _prepare_all(
    provider: SandboxProvider,
    tasks: list[Task],
    default_image: str,
    at_once: int,
    finished: Callable[[Task], None] = lambda task: None,
) -> list[tuple[tuple[str, str] | None, float]]:
    """`provider.prepare` for every task, `at_once` threads pulling from one queue; for each
    task (in order) None, or its path and what it failed with, and the seconds it took; each
    task `finished` as its image is built or found. Ctrl-C
    stops what has not started; the threads are daemons, so a build running then ends with the
    process."""
    results: list[tuple[tuple[str, str] | None, float]] = [(None, 0.0)] * len(tasks)
    pending: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(tasks)):
        pending.put(index)
    stopped = threading.Event()

    def work() -> None:
        while not stopped.is_set():
            try:
                index = pending.get_nowait()
            except queue.Empty:
                return
            started = time.monotonic()
            failure = _failure(provider, tasks[index], default_image)
            results[index] = (failure, round(time.monotonic() - started, 3))
            finished(tasks[index])

    threads = [
        threading.Thread(target=work, name=f"hemra-build-{n}", daemon=True) for n in range(at_once)
    ]
    deadline = time.monotonic() + build_deadline_secs(tasks)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
            if thread.is_alive():
                raise InfraError(
                    f"image builds did not finish within {build_deadline_secs(tasks):g}s (each"
                    " task's build_timeout_sec, twice over: its image and its verifier's, one"
                    " after another)"
                )
    finally:
        stopped.set()
    return results


def build_deadline_secs(tasks: list[Task]) -> float:
    """The longest every build of `tasks` may take, even one after another: each task's image
    and its verifier's, each within its `build_timeout_sec`, and a margin for the engine."""
    return sum(2 * task.config.environment.build_timeout_sec for task in tasks) + BUILD_MARGIN_SECS


def _failure(provider: SandboxProvider, task: Task, default_image: str) -> tuple[str, str] | None:
    """Prepare one task's image: None when it is there, else (its path, the one-line error)."""
    try:
        provider.prepare(task, default_image)
        room = verifier_task(task)
        if room is not None:  # its [verifier.environment], built from its tests/ folder
            provider.prepare(room, default_image)
    except HemraError as error:
        text = str(error)
    except Exception as error:  # the Docker SDK and requests raise many kinds
        text = f"{type(error).__name__}: {error}"
    else:
        return None
    where = str(task.path)
    return where, text if text.startswith(where) else f"{where}: {text}"
