"""Pure parsers: rewards, apt mirrors, placeholders, harness digests."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_hemra.errors import VerifierError
from pytest_hemra.harnesses import render_argv
from pytest_hemra.reward import parse_reward
from pytest_hemra.sandbox.base_image import apt_mirror
from pytest_hemra.spec import HarnessSpec
from pytest_hemra.trial import tree_diff


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"reward.txt": b"1\n"}, (1.0, {"reward": 1.0})),
        ({"reward.txt": b" 0.5 "}, (0.5, {"reward": 0.5})),
        (
            {"reward.json": b'{"reward": 0.25, "checks": 4}'},
            (0.25, {"reward": 0.25, "checks": 4.0}),
        ),
        ({"reward.json": b'{"reward": 1}', "reward.txt": b"0"}, (1.0, {"reward": 1.0})),
    ],
)
def test_rewards_are_read(
    files: dict[str, bytes], expected: tuple[float, dict[str, float]]
) -> None:
    assert parse_reward(files) == expected


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "wrote no"),
        ({"reward.txt": b"nan"}, "finite"),
        ({"reward.txt": b"inf"}, "finite"),
        ({"reward.txt": b"yes"}, "expected a number, got 'yes'"),
        ({"reward.txt": b""}, "expected a number"),
        ({"reward.json": b'{"reward": NaN}'}, "finite"),
        ({"reward.json": b'{"reward": "1"}'}, "expected a number"),
        ({"reward.json": b'{"reward": true}'}, "expected a number"),
        ({"reward.json": b'{"reward": {"a": 1}}'}, "expected a number"),
        ({"reward.json": b"[1]"}, "flat JSON object"),
        ({"reward.json": b"{"}, "not valid JSON"),
        ({"reward.json": b'{"score": 1}'}, "key 'reward' is missing"),
    ],
)
def test_unusable_rewards_are_refused(files: dict[str, bytes], message: str) -> None:
    with pytest.raises(VerifierError, match=message):
        parse_reward(files)


def test_mirror_is_read_from_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(
        "Types: deb\n# comment\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://security.example/debian-security\n"
        "Suites: bookworm-security\n"
    )
    assert (
        apt_mirror("bookworm", (tmp_path / "none.list", tmp_path)) == "http://mirror.example/debian"
    )


def test_mirror_is_read_from_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "# deb http://old.example/debian bookworm main\n"
        "deb [arch=amd64] http://one.example/debian bookworm main\n"
    )
    assert apt_mirror("bookworm", (tmp_path / "sources.list",)) == "http://one.example/debian"


def test_placeholders_fill_argv_items_without_a_shell() -> None:
    argv = ["agent", "--model={model}", "{instruction}", "{not_one}"]
    values = {"model": "m", "instruction": "do $(rm -rf /) now"}
    assert render_argv(argv, values) == ["agent", "--model=m", "do $(rm -rf /) now", "{not_one}"]


def test_harness_digest_is_canonical() -> None:
    one = HarnessSpec.model_validate({"kind": "program", "command": ["a"], "env": ["X"]})
    two = HarnessSpec.model_validate({"env": ["X"], "command": ["a"], "kind": "program"})
    other = HarnessSpec.model_validate({"kind": "program", "command": ["b"]})
    assert one.digest() == two.digest() != other.digest()
    assert len(one.digest()) == 64


def test_diff_names_binary_files_and_new_files() -> None:
    diff = tree_diff(
        {"a.txt": b"x\n", "bin": b"\xff\x00"}, {"a.txt": b"y", "bin": b"\xfe", "new.txt": b"n\n"}
    )
    assert "-x\n+y\n" in diff
    assert "Binary files a/bin and b/bin differ" in diff
    assert "--- /dev/null\n+++ b/new.txt" in diff
