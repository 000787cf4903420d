"""The README's path for users, as one would walk it: HEMRA's wheel built from this checkout
(what the README's install line, a clone and `pip install ./pytest-hemra`, builds) and installed
into a fresh virtualenv outside it, then every command the README marks runnable, in order, from
an empty folder, each exiting as the README says.

The wheel is installed with `--no-deps` into a virtualenv that also sees the site-packages of the
Python running the tests (a `.pth` line, like `--system-site-packages` but for this environment,
a tox virtualenv included): HEMRA's dependencies are already there, and installing them again
(scipy among them) would take minutes, not seconds. A `.pth` line adds a folder without
processing the `.pth` files in it, so an editable install of the checkout there is not seen;
the test checks that `hemra` and `pytest_hemra` (its bundled datasets too) come from the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, TaskMaker
from tests.docs_runner import Reader
from tests.test_plugins import OPTIONS_ONLY

# The README's install line: the repository of [project.urls], cloned, and pip building it.
HOMEPAGE = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Homepage"]
INSTALL = f"git clone {HOMEPAGE} && pip install ./{HOMEPAGE.rsplit('/', 1)[1]}"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HEMRA's wheel, built once a session (pip's cache keeps the build backend)."""
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("pytest_hemra-*.whl")
    return found


@dataclass(frozen=True)
class Installed:
    venv: Path
    python: Path
    env: dict[str, str]  # the virtualenv's bin first on PATH, no HEMRA_STORE or PYTHONPATH


@pytest.fixture
def installed(wheel: Path, tmp_path: Path) -> Installed:
    """A fresh virtualenv outside the checkout with the wheel installed (`--no-deps`)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    found = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(found.stdout.strip()) / "dependencies.pth").write_text("\n".join(ours) + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", "--ignore-installed", str(wheel)],  # (tox's copy is seen as installed)
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("HEMRA_STORE", "PYTHONPATH")}
    env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}", "VIRTUAL_ENV": str(venv)}
    return Installed(venv, python, env)


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_the_readme_path_runs_from_an_empty_folder_with_the_wheel_installed(
    installed: Installed, tmp_path: Path
) -> None:
    venv, python, env = installed.venv, installed.python, installed.env
    bundled = "from pytest_hemra.resolve import datasets; print(datasets.bundled_dir('datasets'))"
    where = subprocess.run(
        [str(python), "-c", bundled],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=True,
    )  # fmt: skip
    assert where.stdout.strip().startswith(str(venv)), (
        where.stdout
    )  # the wheel's, not the checkout's

    folder = tmp_path / "empty"
    folder.mkdir()

    def installed_instead(command: str) -> str | None:
        """The clone and `pip install` are what built and installed the wheel above: check it
        took (the clone's address is the package's own; the folder pip is given, the clone's)."""
        return (
            f'test "$(command -v hemra)" = {venv / "bin" / "hemra"}'
            if command == INSTALL
            else command
        )

    readme = (REPO / "README.md").read_text()
    assert f"```bash runnable\n{INSTALL}\n" in readme
    # PyPI's line is said, as the way after a release, and run nowhere: it finds nothing yet
    assert "`pip install pytest-hemra`" in readme
    assert not any("pip install pytest-hemra" in block for block in readme.split("```")[1::2])
    done = Reader(folder, env, replace=installed_instead).run(readme)
    assert any(line.startswith("hemra run my-eval/run.toml") for line in done), done
    assert any(line.startswith("hemra init --example") for line in done), done
    assert (folder / "examples" / "oracle-vs-nop.toml").is_file()  # the wheel's example
    assert any("after Ctrl-C" in line for line in done), done
    assert (folder / "report.html").is_file() and (folder / ".hemra" / "hemra.db").is_file()
    # the starter's run.toml says where `hemra report` finds the results: where `hemra run` ran
    said = (folder / "my-eval" / "run.toml").read_text()
    assert "hemra report                   (from the folder you ran hemra run in" in said
    beside = subprocess.run(
        ["hemra", "report"], cwd=folder / "my-eval", env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert beside.returncode == 4 and "no store at" in beside.stderr


LOADERS_CONFTEST = """
import json, sys

def pytest_sessionfinish(session):
    loaders = {
        name: type(module.__spec__.loader).__name__
        for name, module in sys.modules.items()
        if name.startswith("pytest_hemra") and getattr(module, "__spec__", None)
    }
    with open("loaders.json", "w") as out:
        json.dump(loaders, out)
"""


def test_an_installed_runs_modules_load_as_any_module_not_through_pytests_rewriting(
    installed: Installed, make_task: TaskMaker, tmp_path: Path
) -> None:
    """pytest rewrites the asserts of every module of an installed plug-in's distribution (an
    editable install's files are not listed, so only the wheel shows it); where no bytecode is
    written, that cost every session and every xdist worker 0.45 s. Only what the entry point
    imports, before any hook runs, is rewritten."""
    make_task("one")
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(LOADERS_CONFTEST)
    argv = [str(installed.python), "-m", "pytest", "-p", "no:cacheprovider", "--collect-only"]
    argv += ["--hemra-harness", "oracle", "--hemra-dataset", str(tmp_path / "datasets" / "ds")]
    done = subprocess.run(
        argv, cwd=project, env=installed.env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    loaders = json.loads((project / "loaders.json").read_text())
    assert "pytest_hemra.plugin.worker" in loaders
    rewritten = {name for name, loader in loaders.items() if loader == "AssertionRewritingHook"}
    assert "pytest_hemra.options" in rewritten  # pytest does rewrite the wheel's modules
    assert rewritten <= OPTIONS_ONLY
