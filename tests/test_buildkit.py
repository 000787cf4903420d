"""Builds say what they need: a Dockerfile using syntax the classic builder lacks (BuildKit's
flags, heredocs, a `# syntax=` directive) is built with the engine's own BuildKit where it can
build it, else refused at resolve in one line naming the task's file, the line and what would
build it. The parser's cases without Docker; the builds in real pytest sessions on real Docker."""

from __future__ import annotations

import re
import secrets
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import BASE_IMAGE, TaskMaker
from pytest_hemra.execute.sandbox.buildkit import (
    Builder,
    BuildKitLine,
    Engine,
    buildkit_lines,
    engine_builder,
    refusal,
)

HEREDOC_DOCKERFILE = f"""\
FROM {BASE_IMAGE}
WORKDIR /app
RUN <<EOF
echo hi > /opt/greeting
chmod 644 /opt/greeting
EOF
COPY <<'EOF' /opt/note.txt
written by a heredoc: $HOME stays as it is
EOF
"""


def test_a_plain_dockerfile_needs_nothing_of_buildkit() -> None:
    plain = f"""\
# a comment first, then a directive-looking line that is only a comment
# syntax=docker/dockerfile:1
FROM {BASE_IMAGE} AS base
RUN echo $((1<<3)) && cat <<<"a here-string" \\
    && echo '--mount is only text here'
COPY --chown=1000:1000 --from=base /etc/hostname /x
"""
    assert buildkit_lines(plain) == []


def test_heredocs_are_found_with_their_line_and_their_bodies_skipped() -> None:
    found = buildkit_lines(
        HEREDOC_DOCKERFILE + "RUN python3 - <<-PY\n\tprint('RUN --mount=x')\n\tPY\nRUN true\n"
    )
    assert found == [
        BuildKitLine(3, "RUN <<EOF", "a heredoc", Builder.DOCKERFILE_1_4),
        BuildKitLine(7, "COPY <<'EOF'", "a heredoc", Builder.DOCKERFILE_1_4),
        BuildKitLine(10, "RUN <<-PY", "a heredoc", Builder.DOCKERFILE_1_4),
    ]


def test_buildkit_flags_are_found_across_continued_lines() -> None:
    dockerfile = f"""\
FROM {BASE_IMAGE}
RUN apt-get update \\
 && true
RUN \\
    # a comment inside the instruction
    --mount=type=cache,target=/root/.cache --network=none \\
    pip install x
COPY --chmod=755 --link tool /usr/bin/tool
"""
    assert buildkit_lines(dockerfile) == [
        BuildKitLine(4, "RUN --mount=type=cache,target=/root/.cache", "a build mount", 1),
        BuildKitLine(4, "RUN --network=none", "a build network", Builder.BUILDKIT),
        BuildKitLine(8, "COPY --chmod=755", "a file mode", Builder.BUILDKIT),
        BuildKitLine(8, "COPY --link", "a linked copy", Builder.DOCKERFILE_1_4),
    ]


def test_a_syntax_directive_counts_only_at_the_top_and_escape_is_honoured() -> None:
    dockerfile = "# escape=`\n# syntax = docker/dockerfile:1.4\nFROM x\nRUN `\n  --mount=a true\n"
    assert buildkit_lines(dockerfile) == [
        BuildKitLine(2, "# syntax=docker/dockerfile:1.4", "a frontend image", 3),
        BuildKitLine(4, "RUN --mount=a", "a build mount", Builder.BUILDKIT),
    ]


def test_what_an_engine_builds_follows_its_version() -> None:
    old = {"Version": "19.03.15", "ApiVersion": "1.40", "Os": "linux"}
    debian = {"Version": "20.10.24+dfsg1", "ApiVersion": "1.41", "Os": "linux"}
    current = {"Version": "28.2.2", "ApiVersion": "1.50", "Os": "linux"}
    windows = {"Version": "28.2.2", "ApiVersion": "1.50", "Os": "windows"}
    assert engine_builder(old).builder is Builder.CLASSIC
    assert engine_builder(debian) == Engine(Builder.BUILDKIT, "Docker 20.10.24+dfsg1, API 1.41")
    assert engine_builder(current).builder is Builder.DOCKERFILE_1_4
    assert engine_builder(windows).builder is Builder.CLASSIC


def test_the_refusal_names_the_file_the_line_and_what_builds_it() -> None:
    dockerfile = Path("/data/ds/task/environment/Dockerfile")
    found = buildkit_lines(HEREDOC_DOCKERFILE)
    debian = engine_builder({"Version": "20.10.24", "ApiVersion": "1.41", "Os": "linux"})
    assert refusal(dockerfile, found, debian) == (
        "/data/ds/task/environment/Dockerfile line 3: `RUN <<EOF` (a heredoc) needs BuildKit"
        " with a Dockerfile 1.4 frontend, which this engine (Docker 20.10.24, API 1.41) lacks:"
        " Docker Engine 23 or later builds it"
    )
    current = engine_builder({"Version": "28.2.2", "ApiVersion": "1.50", "Os": "linux"})
    assert refusal(dockerfile, found, current) is None
    mount = buildkit_lines("FROM x\nRUN --mount=type=cache,target=/c true\n")
    assert refusal(dockerfile, mount, debian) is None
    old = engine_builder({"Version": "19.03.15", "ApiVersion": "1.40", "Os": "linux"})
    assert refusal(dockerfile, mount, old) == (
        "/data/ds/task/environment/Dockerfile line 2: `RUN --mount=type=cache,target=/c`"
        " (a build mount) needs BuildKit, which this engine (Docker 19.03.15, API 1.40)"
        " lacks: Docker Engine 20.10 or later builds it"
    )
    syntax = buildkit_lines("# syntax=docker/dockerfile:1\nFROM x\n")
    assert (refusal(dockerfile, syntax, current) or "").startswith(
        "/data/ds/task/environment/Dockerfile line 1: `# syntax=docker/dockerfile:1` names a"
        " Dockerfile frontend image for BuildKit to pull, and HEMRA builds without pulling:"
        " delete the line"
    )


# real builds, real sessions


def trials(pytester: pytest.Pytester) -> dict[str, tuple[str, float | None]]:
    connection = sqlite3.connect(pytester.path / ".hemra" / "hemra.db")
    found = connection.execute("SELECT item_id, outcome, reward FROM trials").fetchall()
    connection.close()
    return {item: (outcome, reward) for item, outcome, reward in found}


def refused_line(result: pytest.RunResult) -> str:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    (error,) = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    return error


@pytest.mark.usefixtures("docker_test")
def test_the_bundled_buildkit_task_is_built_with_the_engines_buildkit_oracle_passes_nop_fails(
    pytester: pytest.Pytester, tmp_path: Path, docker_client: Any
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle", "nop"]\ndatasets = ["harbor-features"]\n'
        'tasks = ["buildkit-mount"]\n'
    )
    result = pytester.runpytest("--hemra-run", str(run_file))

    assert trials(pytester) == {
        "harbor-features::buildkit-mount[oracle-1]": ("pass", 1.0),
        "harbor-features::buildkit-mount[nop-1]": ("fail", 0.0),
    }
    result.assert_outcomes(passed=1, failed=1)
    images = docker_client.images.list(filters={"label": "hemra.task=buildkit-mount"})
    (image,) = [i for i in images if any(t.startswith("hemra-task:") for t in i.tags)]
    comments = {step.get("Comment") for step in image.history()}
    assert "buildkit.dockerfile.v0" in comments  # BuildKit's build, not the classic builder's


@pytest.mark.usefixtures("docker_test")
def test_a_heredoc_builds_where_the_engines_buildkit_parses_it_else_is_refused_at_resolve(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, docker_client: Any
) -> None:
    task = make_task(
        "heredoc",
        dockerfile=HEREDOC_DOCKERFILE.replace("echo hi", f"echo hi-{secrets.token_hex(4)}"),
        solve="cp /opt/note.txt /app/out.txt && sed -i 's/.*/hi/' /app/out.txt",
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')

    result = pytester.runpytest("--hemra-run", str(run_file))

    if engine_builder(docker_client.version()).builder >= Builder.DOCKERFILE_1_4:
        result.assert_outcomes(passed=1)
        return
    # this engine's BuildKit predates heredocs (Docker 20.10, as Debian 12 ships it)
    error = refused_line(result)
    assert re.fullmatch(
        rf"ERROR: {re.escape(str(task))}/environment/Dockerfile line 3: `RUN <<EOF` \(a heredoc\)"
        r" needs BuildKit with a Dockerfile 1\.4 frontend, which this engine \(Docker [^)]+\)"
        r" lacks: Docker Engine 23 or later builds it",
        error,
    ), error
    assert not (pytester.path / ".hemra").exists()  # refused at resolve: nothing recorded


@pytest.mark.usefixtures("docker_test")
def test_a_syntax_directive_is_refused_at_resolve_in_one_line(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    task = make_task(
        "frontend", dockerfile=f"# syntax=docker/dockerfile:1.4\nFROM {BASE_IMAGE}\nWORKDIR /app\n"
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')

    error = refused_line(pytester.runpytest("--hemra-run", str(run_file)))

    assert error == (
        f"ERROR: {task}/environment/Dockerfile line 1: `# syntax=docker/dockerfile:1.4` names a"
        " Dockerfile frontend image for BuildKit to pull, and HEMRA builds without pulling:"
        " delete the line (the engine's own frontend then builds the file)"
    )
    assert not (pytester.path / ".hemra").exists()


@pytest.mark.usefixtures("docker_test")
def test_a_failing_buildkit_build_names_the_task_the_error_and_what_the_step_printed(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    task = make_task(
        "broken",
        dockerfile=f"FROM {BASE_IMAGE}\nRUN --mount=type=tmpfs,target=/scratch"
        f" echo {secrets.token_hex(4)} && echo 'E: Unable to locate package left-pad' >&2;"
        " exit 3\n",
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')

    error = refused_line(pytester.runpytest("--hemra-run", str(run_file)))

    assert error.startswith(f"ERROR: {task}: image build failed (BuildKit): "), error
    assert re.search(r"exit code: 3 \(.*E: Unable to locate package left-pad.*\)$", error), error
    assert "\x1b" not in error
