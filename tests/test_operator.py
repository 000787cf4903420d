"""Operator conveniences: `hemra init`, `hemra run --dry-run`, `hemra harnesses`."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.usefixtures("docker_test")
def test_init_writes_a_starter_that_runs_as_it_is(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    target = tmp_path / "eval"
    init = pytester.run("hemra", "init", str(target))
    assert init.ret == 0
    init.stdout.fnmatch_lines(["wrote */run.toml", "next: hemra run */run.toml*"])
    result = pytester.runpytest("--hemra-run", str(target / "run.toml"))
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["nop (baseline)*2/2*0*", "my-agent*2/2*2*1.000*"])
    again = pytester.run("hemra", "init", str(target))
    assert again.ret == 4 and "already exists; hemra init overwrites nothing" in again.stderr.str()


def test_dry_run_prints_the_plan_and_records_nothing(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle", "nop"]\ndatasets = ["hemra-offline"]\nattempts = 3\n'
        '[[judge]]\nname = "correctness"\nmodel = "hemra/scripted"\n'
    )
    result = pytester.run("hemra", "run", str(run_file), "--dry-run")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            f"run 'run' from {run_file} (nothing recorded)",
            "  oracle (baseline): program 1, digest * (*oracle.toml)",
            "  hemra-offline@*: 6 tasks (*)",
            "trials: 6 tasks x 2 cells x 3 attempts = 36",
            "judges: correctness",
            "images to build: *",
        ]
    )
    assert not (pytester.path / ".hemra").exists()
    bad = pytester.run("hemra", "run", str(run_file), "--dry-run", "-H", "ghost")
    assert bad.ret == 4 and "no harness named 'ghost'" in bad.stderr.str()


def test_harnesses_lists_kind_version_and_what_hemra_observes(pytester: pytest.Pytester) -> None:
    result = pytester.run("hemra", "harnesses")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "harness*kind*version*package*gateway usage*own usage*transcript*file",
            "claude-code*cli*npm:@anthropic-ai/claude-code@*yes*claude-code*gateway's calls*",
            "oracle*program*no model calls*no*no*",
        ]
    )
