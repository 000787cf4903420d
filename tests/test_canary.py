"""`hemra canary`: the gateway's count against the upstream's own, for real, per wire."""

from __future__ import annotations

import pytest

from pytest_hemra.core.usage import Usage
from pytest_hemra.execute.gateway.canary import reported_usage
from pytest_hemra.execute.gateway.wire import Wire
from tests.upstream import USAGE, running_upstream


def test_canary_passes_against_the_scripted_model(pytester: pytest.Pytester) -> None:
    result = pytester.run("hemra", "canary")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "ok   anthropic-messages stream: gateway recorded input 100, output 50, *",
            "ok   openai-chat stream: *",
            "canary: 6/6 calls counted as the upstream reports",
        ]
    )


def test_canary_agrees_with_an_upstream_of_its_own(pytester: pytest.Pytester) -> None:
    with running_upstream() as upstream:
        result = pytester.run(
            "hemra", "canary", "--base-url", upstream.url, "--model", "claude-test",
            "--wire", "anthropic-messages", "--wire", "openai-chat",
        )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [f"ok   anthropic-messages: gateway recorded input {USAGE['input_tokens']}, *"]
    )


def test_canary_fails_clearly_when_the_upstreams_usage_is_altered(
    pytester: pytest.Pytester,
) -> None:
    # A test double stands in for the scripted model but reports other numbers than it would.
    with running_upstream() as double:
        result = pytester.run(
            "hemra", "canary", "--base-url", double.url, "--model", "claude-test",
            "--expect", "scripted", "--wire", "anthropic-messages",
        )  # fmt: skip
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "FAIL anthropic-messages: gateway recorded input 11, output 7, cache read 3,"
            " cache write 2; upstream reported input 100, output 50, cache read 20,"
            " cache write 10",
            "canary: 0/2 calls counted as the upstream reports",
        ]
    )


def test_reported_usage_reads_the_last_figures_anywhere_in_the_body() -> None:
    stream = (
        b'event: message_start\ndata: {"type": "message_start", "message": {"usage":'
        b' {"input_tokens": 5, "output_tokens": 1}}}\n\n'
        b'event: message_delta\ndata: {"type": "message_delta", "usage": {"output_tokens": 9,'
        b' "input_tokens": 6}}\n\n'
    )
    assert reported_usage(Wire.ANTHROPIC, stream) == Usage(6, 9, 0, 0)
    chat = (
        b'{"usage": {"prompt_tokens": 30, "completion_tokens": 4,'
        b' "prompt_tokens_details": {"cached_tokens": 10}}}'
    )
    assert reported_usage(Wire.CHAT, chat) == Usage(20, 4, 10, 0)
    assert reported_usage(Wire.CHAT, b"data: [DONE]\n\n") is None
