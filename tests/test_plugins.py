"""HEMRA as an installed plug-in: it costs an unrelated pytest session nothing, and the plug-ins
it reads (sandbox providers) come from the same entry points under pytest and under `hemra`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import TaskMaker
from pytest_hemra.store import Store

HEAVY = ("aiohttp", "docker", "scipy", "jinja2", "pydantic", "sqlite_utils", "pytest_hemra.plugin")
OPTIONS_ONLY = {
    "pytest_hemra",
    "pytest_hemra.options",
    "pytest_hemra.core",
    "pytest_hemra.core.hookspecs",
    "pytest_hemra.core.store_location",  # --hemra-store's help text (the standard library alone)
    "pytest_hemra.resolve",
    "pytest_hemra.resolve.overrides",
}

MODULES_CONFTEST = """
import json, sys

def pytest_sessionfinish(session):
    with open("modules.json", "w") as out:
        json.dump(sorted(sys.modules), out)
"""


def test_a_session_that_asks_for_no_run_imports_only_the_options_module(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(MODULES_CONFTEST)
    pytester.makepyfile("def test_one():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    modules = set(json.loads((pytester.path / "modules.json").read_text()))
    assert [name for name in HEAVY if name in modules] == []
    assert {name for name in modules if name.startswith("pytest_hemra")} <= OPTIONS_ONLY
    assert "pytest_hemra.options" in modules  # the entry point is installed, and loaded


def test_no_hemra_disables_every_hemra_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_one():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:hemra", "--hemra-run", "run.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --hemra-run*"])


def test_a_run_loads_the_pytest_face_and_its_gateway_fixture(
    pytester: pytest.Pytester, make_task: TaskMaker, tmp_path: Path
) -> None:
    make_task("one")
    pytester.makeconftest(MODULES_CONFTEST)
    dataset = str(tmp_path / "datasets" / "ds")
    result = pytester.runpytest_subprocess(
        "--fixtures", "--collect-only", "--hemra-harness", "oracle", "--hemra-dataset", dataset
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["hemra_gateway*"])
    assert "pytest_hemra.plugin" in json.loads((pytester.path / "modules.json").read_text())


MARKED_PROVIDER = '''
"""A third-party sandbox provider: Docker, noting each sandbox it opens in $MARKER."""

import os
from contextlib import contextmanager
from pathlib import Path

import pytest


def marked():
    from pytest_hemra.execute.sandbox.docker import DockerProvider

    class MarkedProvider(DockerProvider):
        name = "marked"

        @contextmanager
        def open(self, request):
            with Path(os.environ["MARKER"]).open("a") as marker:
                marker.write(f"{os.getpid()}\\n")
            with super().open(request) as sandbox:
                yield sandbox

    return MarkedProvider()


@pytest.hookimpl
def pytest_hemra_sandbox_providers():
    return {"marked": marked}
'''


def install_marked_provider(site: Path) -> None:
    """An installed distribution whose `pytest11` entry point provides sandbox provider `marked`."""
    site.mkdir()
    (site / "marked_provider.py").write_text(MARKED_PROVIDER)
    info = site / "marked_provider-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: marked-provider\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[pytest11]\nmarked = marked_provider\n")


@pytest.mark.usefixtures("docker_test")
def test_a_sandbox_provider_from_a_pytest11_plugin_is_used_by_hemra_serve(
    tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("one")
    make_task("two")
    install_marked_provider(tmp_path / "site")
    marker = tmp_path / "marker.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
        "MARKER": str(marker),
    }
    store_path = tmp_path / "s.db"
    dataset = str(tmp_path / "datasets" / "ds")
    queued = subprocess.run(
        ["hemra", "run", "-H", "oracle", "-d", dataset, "--sandbox", "marked", "--detach",
         "--store", str(store_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert queued.returncode == 0, queued.stdout + queued.stderr
    run_id = queued.stdout.strip()
    assert not marker.exists()  # queued, nothing opened yet

    served = subprocess.run(
        ["hemra", "serve", "--store", str(store_path), "--once", "--no-viewer"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert served.returncode == 0, served.stdout + served.stderr
    store = Store(store_path)
    assert [t.outcome for t in store.trials(run_id)] == ["pass", "pass"]
    assert len(marker.read_text().split()) == 2  # each trial's sandbox came from the plug-in
