"""Pure parsers: rewards, apt mirrors, placeholders, harness digests, harnesses' own numbers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pytest_hemra.core.errors import SpecError, VerifierError
from pytest_hemra.core.reward import parse_reward
from pytest_hemra.core.trial import SelfReport
from pytest_hemra.execute.diff import tree_diff
from pytest_hemra.execute.sandbox.base_image import apt_mirror
from pytest_hemra.execute.selfreport import parse_output
from pytest_hemra.resolve.harness_spec import ADDED_HARNESS_KEYS, HarnessSpec, load_harness_spec
from pytest_hemra.resolve.harnesses import render_argv


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
        ({"reward.json": b'{"score": 1}'}, (1.0, {"score": 1.0})),  # its only key
        # several keys, none the headline: the lowest (tests/test_rewards.py)
        (
            {"reward.json": b'{"correctness": 1, "performance": 0.5}'},
            (0.5, {"correctness": 1.0, "performance": 0.5}),
        ),
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
        ({"reward.json": b"{}"}, "expected a flat JSON object of numbers, got {}"),
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


def test_a_harness_key_added_later_moves_no_digest_of_a_file_without_it() -> None:
    harness = HarnessSpec.model_validate({"kind": "cli", "command": ["a"]})
    before = json.dumps(  # the canonical content before the added keys existed
        harness.model_dump(mode="json", exclude=set(ADDED_HARNESS_KEYS)),
        sort_keys=True,
        separators=(",", ":"),
    )
    assert harness.digest() == hashlib.sha256(before.encode()).hexdigest()
    whole = HarnessSpec.model_validate({"kind": "cli", "command": ["a"], "edit_format": "whole"})
    assert whole.digest() != harness.digest()


def test_diff_names_binary_files_and_new_files() -> None:
    diff = tree_diff(
        {"a.txt": b"x\n", "bin": b"\xff\x00"}, {"a.txt": b"y", "bin": b"\xfe", "new.txt": b"n\n"}
    )
    assert "-x\n+y\n" in diff
    assert "Binary files a/bin and b/bin differ" in diff
    assert "--- /dev/null\n+++ b/new.txt" in diff


def test_an_edit_format_other_than_whole_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "aider.toml"
    path.write_text('kind = "cli"\ncommand = ["aider"]\nedit_format = "diff"\n')
    with pytest.raises(SpecError, match=r"aider\.toml: key 'edit_format': input should be 'whole'"):
        load_harness_spec(path)


# aider's stdout with --no-pretty: its banner, each reply as it printed it, then a Tokens line
AIDER_STDOUT = """Aider v0.86.2
Model: openai/hemra/scripted with whole edit format
Git repo: none
Repo-map: disabled

I created hello.txt.



hello.txt

```
hello, world

```

Tokens: 120 sent, 50 received.

hello.txt
Applied edit to hello.txt
"""


def test_aider_tokens_line_is_read_with_cached_input_out_of_sent() -> None:
    assert parse_output("aider", AIDER_STDOUT) == SelfReport(
        input_tokens=120,
        output_tokens=50,
        turns=1,
        is_estimate=True,  # aider's tokenizer's
    )
    own = parse_output("aider", "Tokens: 900 sent, 100 cache write, 300 cache hit, 40 received.")
    assert own is not None
    assert (own.input_tokens, own.cache_write_tokens, own.cache_read_tokens) == (500, 100, 300)
    assert own.total_tokens == 940


def test_aider_sums_its_calls_reads_k_counts_and_keeps_the_session_cost() -> None:
    text = (
        "First reply.\n"
        "Tokens: 2.4k sent, 12 received. Cost: $0.01 message, $0.01 session.\n"
        "Second reply.\n"
        "Tokens: 12k sent, 1.5k cache write, 300 cache hit, 1.0k received.\n"
        "Cost: $0.03 message, $0.04 session.\n"
    )
    own = parse_output("aider", text)
    assert own is not None
    assert (own.input_tokens, own.output_tokens) == (2400 + 12000 - 1500 - 300, 12 + 1000)
    assert (own.cache_write_tokens, own.cache_read_tokens) == (1500, 300)
    assert (own.turns, own.cost_usd, own.final_message) == (2, 0.04, None)


def test_aider_output_without_a_tokens_line_reports_nothing() -> None:
    assert parse_output("aider", "Aider v0.86.2\nlitellm.APIConnectionError: refused\n") is None


def test_mini_swe_agent_numbers_are_read_from_its_trajectory_file() -> None:
    usage = {"prompt_tokens": 120, "completion_tokens": 50}
    response = {"usage": {**usage, "prompt_tokens_details": {"cached_tokens": 20}}}
    trajectory = {
        "info": {"model_stats": {"instance_cost": 0.25, "api_calls": 2}},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "assistant", "content": "", "extra": {"response": response}},
            {"role": "tool", "content": "", "extra": {"returncode": 0}},
            {"role": "assistant", "content": "", "extra": {"response": {"usage": usage}}},
            {
                "role": "exit",
                "content": "",
                "extra": {"exit_status": "Submitted", "submission": ""},
            },
        ],
    }
    own = parse_output("mini-swe-agent", json.dumps(trajectory))
    assert own == SelfReport(
        input_tokens=100 + 120,
        output_tokens=100,
        cache_read_tokens=20,
        cost_usd=0.25,
        turns=2,
        final_message="Submitted",
        is_error=False,
    )
    assert parse_output("mini-swe-agent", "not json") is None
    limit = {
        **trajectory,
        "messages": [
            *trajectory["messages"][:-1],
            {"role": "exit", "extra": {"exit_status": "LimitsExceeded"}},
        ],
    }
    found = parse_output("mini-swe-agent", json.dumps(limit))
    assert found is not None and found.is_error
