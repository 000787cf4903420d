"""The docs say what the code does: links resolve, the command-line reference and the exit codes
are the parsers', the walk-throughs end with files that run, the package says where its docs
are. No Docker: the commands the pages show are run by test_docs_commands.py and
test_first_run.py."""

from __future__ import annotations

import argparse
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from pytest_hemra import DOCS_URL
from pytest_hemra.cli import build_parser
from pytest_hemra.cli.exits import MEANINGS, Exit
from pytest_hemra.cli.reference import render_reference

PAGES = sorted(
    [REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").glob("*.md")]
    + [p for p in (REPO / "examples").rglob("README.md") if ".benchmarks" not in p.parts]
)
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(markdown: str) -> str:
    """A page without its code: links in code blocks and `spans` are not links."""
    return re.sub(r"`[^`\n]*`", "", FENCED.sub("", markdown))


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to
    dashes, a repeated heading numbered."""
    found: set[str] = set()
    for heading in re.findall(r"^#+\s+(.*?)\s*$", FENCED.sub("", markdown), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_internal_link_resolves_to_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: outside the repository
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert broken == [], f"{page.name}: {broken}"


def test_every_docs_page_is_linked_from_the_readme_or_another_page() -> None:
    linked = {
        (page.parent / target.partition("#")[0]).resolve()
        for page in PAGES
        for target in LINK.findall(prose(page.read_text()))
        if not re.match(r"[a-z]+:", target)
    }
    orphans = [p.name for p in (REPO / "docs").glob("*.md") if p.resolve() not in linked]
    assert orphans == []


def test_the_cli_reference_is_what_the_parsers_say() -> None:
    committed = (REPO / "docs" / "cli.md").read_text()
    assert committed == render_reference(build_parser()), (
        "docs/cli.md is stale: python -m pytest_hemra.cli.reference > docs/cli.md"
    )


def test_every_command_and_argument_has_help_text() -> None:
    missing = []

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                missing.extend(f"{parser.prog} {n}" for n, h in helps.items() if not h)
                for sub in action.choices.values():
                    walk(sub)
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser())
    assert missing == []


def test_exit_codes_are_listed_once_with_one_meaning_each_and_in_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert [int(code) for code in MEANINGS] == [0, 1, 2, 3, 4, 5]
    assert len(set(MEANINGS.values())) == len(MEANINGS)
    # the codes pytest returns from `hemra run` mean the same (newer pytest adds codes of its own)
    assert {int(c) for c in Exit} <= {int(c) for c in pytest.ExitCode}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for code, meaning in MEANINGS.items():
        assert f"{int(code)} {' '.join(meaning.split())}" in shown
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    assert "exit codes:" in capsys.readouterr().out


def test_every_report_flag_is_documented_in_reports_md() -> None:
    kinds = {
        kind
        for source in (REPO / "pytest_hemra" / "report").glob("*.py")
        for kind in re.findall(r'Flag\(\s*"([a-z_]+)"', source.read_text())
    }
    reports = (REPO / "docs" / "reports.md").read_text()
    assert kinds and sorted(k for k in kinds if f"`{k}`" not in reports and k not in reports) == []


def test_the_readme_names_every_bundled_harness_and_dataset() -> None:
    readme = (REPO / "README.md").read_text()
    harnesses = sorted(p.stem for p in (REPO / "harnesses").glob("*.toml"))
    datasets = sorted(p.name for p in (REPO / "datasets").iterdir() if p.is_dir())
    assert [h for h in harnesses if f"`{h}`" not in readme] == []
    assert [d for d in datasets if f"`{d}`" not in readme] == []


def test_the_harness_walk_through_ends_with_the_bundled_mini_swe_agent_file() -> None:
    page = (REPO / "docs" / "write-a-harness.md").read_text()
    (written,) = re.findall(r"```toml file=harnesses/mini.toml\n(.*?)```", page, re.DOTALL)
    bundled = (REPO / "harnesses" / "mini-swe-agent.toml").read_text()
    assert tomllib.loads(written) == tomllib.loads(bundled)


def test_the_claude_vs_codex_harnesses_are_the_bundled_ones_each_with_its_model() -> None:
    for name in ("claude-code", "codex"):
        pinned = tomllib.loads(
            (REPO / "examples/claude-vs-codex/harnesses" / f"{name}.toml").read_text()
        )
        bundled = tomllib.loads((REPO / "harnesses" / f"{name}.toml").read_text())
        assert pinned.pop("model") and "model" not in bundled
        assert pinned == bundled


def test_the_package_says_where_its_docs_license_and_changelog_are() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["urls"]["Documentation"] == DOCS_URL
    assert project["license"] == "MIT"
    assert (REPO / "LICENSE").read_text().startswith("MIT License")
    assert "## Unreleased" in (REPO / "CHANGELOG.md").read_text()
    # the starter a pip user gets links to pages that exist, online (they have no docs/)
    starter = REPO / "pytest_hemra" / "templates" / "init"
    linked = [
        url
        for path in starter.rglob("*.toml")
        for url in re.findall(r"https://\S+", path.read_text())
    ]
    assert linked and all(url.startswith(DOCS_URL + "/") for url in linked)
    assert [
        u for u in linked if not (REPO / "docs" / u.removeprefix(DOCS_URL + "/")).is_file()
    ] == []
    assert "docs/" not in re.sub(r"https://\S+", "", (starter / "run.toml").read_text())


def test_every_readme_command_is_run_by_a_test_but_the_two_that_cannot_be() -> None:
    """test_wheel.py runs the README's runnable blocks; what it cannot run is named here: the
    real-model run (it needs a key; its offline rehearsal is runnable) and the contributors'
    path (a clone, then tox: what .ci/run does)."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"^```(bash|sh|console)([^\n]*)\n(.*?)^```", readme, re.M | re.S)
    not_run = [body for _, info, body in blocks if "runnable" not in info.split()]
    assert len(blocks) - len(not_run) >= 3
    assert len(not_run) == 2
    assert "export OPENAI_API_KEY=sk-" in not_run[0]
    assert "git clone" in not_run[1] and "\ntox " in not_run[1]


def test_the_github_actions_example_is_yaml_whose_hemra_commands_the_cli_takes() -> None:
    """GitHub cannot run here: the job is checked for what can go wrong before it runs."""
    job = yaml.safe_load((REPO / "examples" / "ci" / "github-actions.yml").read_text())
    steps = job["jobs"]["evaluate"]["steps"]
    assert all("@v" in step["uses"] for step in steps if "uses" in step)
    commands = [
        shlex.split(line.replace('"$(command -v hemra)"', "hemra"), comments=True)
        for step in steps
        for line in step.get("run", "").splitlines()
        if "hemra" in line
    ]
    assert [words[:4] for words in commands] == [
        ["sudo", "-E", "hemra", "run"],
        ["sudo", "-E", "hemra", "report"],
    ]
    for words in commands:
        ours = words[3 : words.index("--")] if "--" in words else words[3:]
        build_parser().parse_args(ours)  # an unknown flag exits 2 here
    assert (REPO / commands[0][4]).is_file()  # the run file, from the repository's root
    (upload,) = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact")]
    assert ".hemra/" in upload["with"]["path"] and upload["with"]["include-hidden-files"]


def test_the_readme_links_work_where_pypi_shows_it() -> None:
    """PyPI shows the README without the repository around it: a relative link is dead there.
    Its links are references to absolute addresses in the repository of `[project.urls]`, each
    checked here against the checkout, file and heading."""
    readme = prose((REPO / "README.md").read_text())
    repository = DOCS_URL.removesuffix("/blob/main/docs")
    assert (
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Homepage"]
        == repository
    )
    assert [t for t in LINK.findall(readme) if not re.match(r"[a-z]+:", t)] == []
    defined = dict(re.findall(r"^\[([^\]]+)\]: (\S+)$", readme, re.MULTILINE))
    used = set(re.findall(r"\]\[([^\]]+)\]", readme))
    used |= set(re.findall(r"\[((?:docs|examples)/[^\]]+|CHANGELOG\.md)\](?![\[(:])", readme))
    assert used == defined.keys()
    wrong = []
    for label, url in defined.items():
        path_part, _, anchor = label.partition("#")
        linked = REPO / path_part
        kind = "tree" if linked.is_dir() else "blob"
        if url != f"{repository}/{kind}/main/{label}" or not linked.exists():
            wrong.append(f"[{label}]: {url}")
        elif anchor and anchor not in anchors(linked.read_text()):
            wrong.append(f"[{label}]: no heading #{anchor} in {linked.name}")
    assert wrong == []
