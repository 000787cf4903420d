"""Progress on slow work reaches the user: plain lines every HEMRA_PROGRESS_SECS seconds where
stderr is not a terminal (CI, logs), for a harness install, image builds and a worked run; and
from a pytest session's items, xdist workers' too, past pytest's capture. Real processes."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import BASE_IMAGE, TaskMaker
from pytest_hemra.store import Store


def quick(**more: str) -> dict[str, str]:
    """The environment with a progress line every half second."""
    return {**os.environ, "HEMRA_PROGRESS_SECS": "0.5", **more}


@pytest.mark.slow
def test_a_harness_install_says_what_it_does_every_few_seconds(
    tmp_path: Path, write_harness: Callable[[str, str], Path]
) -> None:
    write_harness(
        "tiny",
        'kind = "cli"\nversion = "1"\npackage = "pypi:six==1.16.0"\ncommand = ["true"]\n',
    )
    done = subprocess.run(
        ["hemra", "harness", "install", "tiny", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=quick(HEMRA_CACHE_DIR=str(tmp_path / "cache")),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    what = "hemra: installing harness tiny (pypi:six==1.16.0): "
    assert lines[0] == what + "started"
    assert any(line.startswith(what) and "(pip install six==1.16.0)" in line for line in lines)
    assert any(re.search(r"libraries the extensions load: \d+ of \d+ read\)$", x) for x in lines)
    assert len([line for line in lines if "so far" in line]) >= 3
    assert re.fullmatch(re.escape(what) + r"done in \d+s", lines[-1])


@pytest.mark.usefixtures("docker_test")
def test_image_builds_say_how_many_of_how_many_are_built(
    tmp_path: Path, make_task: TaskMaker
) -> None:
    for n in (1, 2):
        make_task(f"build-{n}", dockerfile=f"FROM {BASE_IMAGE}\nRUN echo {secrets.token_hex(8)}"
                  " && sleep 1\nWORKDIR /app\nUSER 1000\n")  # fmt: skip
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n[sandbox]\nimage_builds = 1\n')
    done = subprocess.run(
        ["hemra", "run", str(run_file), "--store", str(tmp_path / "s.db")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=quick(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("hemra: task images:")]
    assert lines[0] == "hemra: task images: started, 0 of 2 built"
    assert any(re.search(r"so far, 1 of 2 built \(build-\d\)$", line) for line in lines), lines
    assert re.fullmatch(r"hemra: task images: done in \d+s, 2 of 2 built", lines[-1])


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_worked_run_says_how_many_trials_are_over_running_and_queued(
    tmp_path: Path, make_task: TaskMaker, write_harness: Callable[[str, str], Path]
) -> None:
    for name in ("one", "two", "three"):
        make_task(name)
    command = '["bash", "-c", "sleep 2; echo hi > /app/out.txt"]'
    write_harness("sleeper", f'kind = "program"\ncommand = {command}\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["sleeper"]\ndatasets = ["ds"]\nconcurrency = 1\n')
    store = str(tmp_path / "s.db")
    run_id = subprocess.run(
        ["hemra", "run", str(run_file), "--detach", "--store", store],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    done = subprocess.run(
        ["hemra", "worker", "--store", store, "--once"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=quick(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"hemra: run {run_id}")]
    assert lines[0] == f"hemra: run {run_id}: started, 0 of 3 trials over"
    assert any(re.search(r"so far, [012] of 3 trials over \(1 running, [012] queued\)$", x)
               for x in lines), lines  # fmt: skip
    assert re.fullmatch(f"hemra: run {run_id}: done in \\d+s, 3 of 3 trials over", lines[-1])


@pytest.mark.parametrize("xdist", [[], pytest.param(["-n", "2"], marks=pytest.mark.slow)])
def test_progress_from_within_a_test_reaches_the_terminal_past_pytests_capture(
    pytester: pytest.Pytester, xdist: list[str]
) -> None:
    pytester.makeconftest(
        """
        from pytest_hemra.core.progress import keep_stderr

        def pytest_configure(config):
            keep_stderr()  # as HEMRA's worker plug-in does, before any item runs
        """
    )
    pytester.makepyfile(
        textwrap.dedent(
            """
            import time
            from pytest_hemra.core.progress import Progress

            def test_slow_step():
                with Progress("a slow step", total=2) as step:
                    time.sleep(0.7)
                    step.advance()
                    time.sleep(0.7)
                    step.advance()

            def test_slow_step_too():
                test_slow_step()
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *xdist],
        capture_output=True, text=True, timeout=120, cwd=pytester.path, env=quick(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert lines.count("hemra: a slow step: started, 0 of 2") == 2, result.stderr
    assert len([line for line in lines if re.search(r"so far, 1 of 2$", line)]) >= 2
    assert "a slow step" not in result.stdout  # not in a captured test's output either


def test_a_worker_with_nothing_queued_says_once_that_it_waits(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    Store(store).close()
    worker = subprocess.Popen(
        ["hemra", "worker", "--store", str(store)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert worker.stdout is not None
    # the worker's start (imports, a sweep of its engine) takes seconds on a loaded machine:
    # wait for its first line, then for several polls of the empty queue (a poll is 1 s)
    watchdog = threading.Timer(120, worker.kill)
    watchdog.start()
    try:
        first = worker.stdout.readline()
        time.sleep(4)
    finally:
        watchdog.cancel()
        worker.send_signal(signal.SIGTERM)
        rest, _ = worker.communicate(timeout=30)
    assert (first + rest).splitlines() == ["hemra worker: the queue is empty; waiting for runs"]
    assert worker.returncode == 0
