"""The gateway, for real: official SDK clients -> gateway on loopback -> a real aiohttp upstream
(or the scripted model), every call counted in a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import openai
import pytest
import requests

from pytest_hemra.core.records import CallRow
from pytest_hemra.execute.gateway.ledger import Budgets, CallPolicy, RunBudget
from pytest_hemra.execute.gateway.scripted import (
    SCRIPTED_USAGE,
    ShellStep,
    TextStep,
    scripted_usage,
)
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.gateway.wire import Wire
from pytest_hemra.store import Store
from tests.upstream import MODEL, USAGE, Upstream

SENTINEL = "sk-sentinel-5d2a9e71"


def calls_of(gateway: Gateway, store: Store, token: str) -> list[CallRow]:
    gateway.close_trial(token)
    return store.calls(run_id="r")


def test_anthropic_calls_are_counted_and_keys_swapped_outside(
    gateway: Gateway, store: Store, upstream: Upstream, tmp_path: Path
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL})
    client = anthropic.Anthropic(
        base_url=access.base_url("127.0.0.1"), api_key=access.token, max_retries=0
    )
    reply = client.messages.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    with client.messages.stream(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
    assert reply.content[0].type == "text" and text == "xxxxx" * 3

    rows = calls_of(gateway, store, access.token)
    assert [(r.status, r.wire, r.trial_id) for r in rows] == [
        (200, "anthropic-messages", "r.1")
    ] * 2
    for row in rows:
        assert (row.input_tokens, row.output_tokens) == (
            USAGE["input_tokens"],
            USAGE["output_tokens"],
        )
        assert (row.cache_read_tokens, row.cache_write_tokens) == (
            USAGE["cache_read"],
            USAGE["cache_write"],
        )
        assert row.model == MODEL and row.cost is not None and row.cost > 0
        presented = row.headers.get("x-api-key") or row.headers.get("authorization")
        assert presented == "[redacted]" and access.token not in json.dumps(row.headers)
    assert [seen["headers"]["x-api-key"] for seen in upstream.seen] == [SENTINEL, SENTINEL]
    assert all(access.token not in json.dumps(seen["headers"]) for seen in upstream.seen)
    assert SENTINEL.encode() not in b"".join(p.read_bytes() for p in tmp_path.iterdir())


def test_refused_tokens_get_401_and_are_recorded(gateway: Gateway, store: Store) -> None:
    one = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL})
    two = gateway.open_trial("r.2", "r", keys={"anthropic": SENTINEL})
    url = gateway.base_urls["127.0.0.1"]
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}

    unknown = requests.post(
        f"{url}/t/hemra-nope/v1/messages",
        json=body,
        headers={"x-api-key": "hemra-nope"},
        timeout=10,
    )
    crossed = requests.post(
        f"{one.base_url('127.0.0.1')}/v1/messages",
        json=body,
        headers={"x-api-key": two.token},
        timeout=10,
    )
    gateway.close_trial(one.token)
    ended = requests.post(
        f"{one.base_url('127.0.0.1')}/v1/messages",
        json=body,
        headers={"x-api-key": one.token},
        timeout=10,
    )

    assert [r.status_code for r in (unknown, crossed, ended)] == [401, 401, 401]
    assert unknown.json()["error"]["type"] == "authentication_error"
    gateway.close_trial(two.token)
    rows = store.calls()
    assert [(r.refused, r.trial_id, r.error) for r in rows] == [
        (True, None, "refused: unknown trial token"),
        (True, "r.1", "refused: mismatched trial token"),
        (True, "r.1", "refused: ended trial token"),
    ]


@pytest.mark.parametrize(
    ("mode", "status", "kind"), [("429", 429, "rate_limit_error"), ("500", 500, "api_error")]
)
def test_upstream_errors_reach_the_harness_as_the_provider_sent_them(
    gateway: Gateway, store: Store, mode: str, status: int, kind: str
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL})
    client = anthropic.Anthropic(
        base_url=access.base_url("127.0.0.1"),
        api_key=access.token,
        max_retries=0,
        default_headers={"x-test-mode": mode},
    )
    with pytest.raises(anthropic.APIStatusError) as raised:
        client.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert raised.value.status_code == status
    assert raised.value.body["error"]["type"] == kind  # type: ignore[index]
    (row,) = calls_of(gateway, store, access.token)
    assert row.status == status and kind in (row.error or "")


def test_unreachable_upstream_is_a_502_in_the_provider_format(
    gateway: Gateway, store: Store
) -> None:
    access = gateway.open_trial("r.1", "r", provider="dead")
    response = requests.post(
        f"{access.base_url('127.0.0.1')}/v1/chat/completions",
        json={"model": "m", "messages": []},
        headers={"Authorization": f"Bearer {access.token}"},
        timeout=10,
    )
    assert response.status_code == 502 and "error" in response.json()
    (row,) = calls_of(gateway, store, access.token)
    assert row.status == 502 and "upstream unreachable" in (row.error or "")


def test_streams_are_forwarded_as_they_arrive(gateway: Gateway, store: Store) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL})
    client = anthropic.Anthropic(
        base_url=access.base_url("127.0.0.1"),
        api_key=access.token,
        max_retries=0,
        default_headers={"x-test-mode": "drip", "x-test-chunks": "5"},
    )
    with client.messages.stream(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        for _ in stream.text_stream:
            break  # the first delta arrives while the upstream is still dripping
        assert store.calls(run_id="r") == []  # the call is still in flight
        "".join(stream.text_stream)
    (row,) = calls_of(gateway, store, access.token)
    assert row.ttfb is not None and row.ttfb < row.latency - 0.5


def test_other_paths_are_forwarded_without_usage_and_openai_usage_is_normalized(
    gateway: Gateway, store: Store
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"openai": SENTINEL})
    client = openai.OpenAI(
        base_url=access.base_url("127.0.0.1") + "/v1", api_key=access.token, max_retries=0
    )
    client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "x"}])
    models = requests.get(
        f"{access.base_url('127.0.0.1')}/v1/models",
        headers={"Authorization": f"Bearer {access.token}"},
        timeout=10,
    )
    assert models.status_code == 200
    chat, listing = calls_of(gateway, store, access.token)
    assert (chat.input_tokens, chat.cache_read_tokens, chat.output_tokens) == (15, 5, 4)
    assert chat.cost == pytest.approx((15 * 2.0 + 5 * 0.5 + 4 * 8.0) / 1e6)
    assert (listing.wire, listing.input_tokens, listing.status) == ("other", 0, 200)


def test_unknown_model_price_is_unknown_never_zero(gateway: Gateway, store: Store) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL})
    client = anthropic.Anthropic(
        base_url=access.base_url("127.0.0.1"), api_key=access.token, max_retries=0
    )
    client.messages.create(
        model="mystery-model-9", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    (row,) = calls_of(gateway, store, access.token)
    assert row.model == "mystery-model-9" and row.input_tokens > 0 and row.cost is None


@pytest.mark.parametrize("stream", [False, True])
def test_scripted_model_through_the_gateway_is_counted_to_the_token(
    gateway: Gateway, store: Store, stream: bool
) -> None:
    script = (ShellStep("echo hi > /app/out.txt"), TextStep("Done."))
    access = gateway.open_trial("r.1", "r", script=script)
    client = anthropic.Anthropic(
        base_url=access.base_url("127.0.0.1"), api_key=access.token, max_retries=0
    )
    tools = [
        {
            "name": "Bash",
            "description": "run",
            "input_schema": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        }
    ]
    request = {
        "model": "hemra/scripted",
        "max_tokens": 100,
        "tools": tools,
        "messages": [{"role": "user", "content": "solve it"}],
    }
    if stream:
        with client.messages.stream(**request) as live:  # type: ignore[arg-type]
            message = live.get_final_message()
    else:
        message = client.messages.create(**request)  # type: ignore[arg-type]
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert block.name == "Bash" and "echo hi" in json.dumps(block.input)

    (row,) = calls_of(gateway, store, access.token)
    assert row.provider == "scripted" and row.model == SCRIPTED_USAGE.model
    assert (row.input_tokens, row.output_tokens, row.cache_read_tokens, row.cache_write_tokens) == (
        SCRIPTED_USAGE.input_tokens,
        SCRIPTED_USAGE.output_tokens,
        SCRIPTED_USAGE.cache_read_tokens,
        SCRIPTED_USAGE.cache_write_tokens,
    )
    assert row.cost == 0.0


def ask(access_url: str, token: str, model: str) -> requests.Response:
    body = {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    return requests.post(
        f"{access_url}/v1/messages", json=body, headers={"x-api-key": token}, timeout=10
    )


def test_other_models_are_flagged_by_default_and_counted(gateway: Gateway, store: Store) -> None:
    policy = CallPolicy(model="claude-sonnet-4-5")
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL}, policy=policy)
    url = access.base_url("127.0.0.1")
    assert ask(url, access.token, "claude-sonnet-4-5-20250929").status_code == 200
    assert ask(url, access.token, "claude-haiku-4-5").status_code == 200
    totals = gateway.close_trial(access.token)
    per_call = sum(USAGE.values())
    assert (totals.total_tokens, totals.other_model_tokens) == (2 * per_call, per_call)


def test_other_models_can_be_refused(gateway: Gateway, store: Store) -> None:
    policy = CallPolicy(model="claude-sonnet-4-5", refuse_other_models=True)
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL}, policy=policy)
    refused = ask(access.base_url("127.0.0.1"), access.token, "claude-haiku-4-5")
    assert refused.status_code == 400 and refused.json()["type"] == "error"
    assert "not this run's model" in refused.json()["error"]["message"]
    (row,) = calls_of(gateway, store, access.token)
    assert row.refused and row.input_tokens == 0


@pytest.mark.parametrize(
    ("policy", "stopped_by"),
    [
        (CallPolicy(max_tokens=20), "token cap"),
        (CallPolicy(max_cost_usd=1e-4), "cost cap"),
    ],
)
def test_trial_caps_stop_further_calls(
    gateway: Gateway, store: Store, policy: CallPolicy, stopped_by: str
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL}, policy=policy)
    url = access.base_url("127.0.0.1")
    first, second = (ask(url, access.token, MODEL) for _ in range(2))
    assert (first.status_code, second.status_code) == (200, 400)
    assert "cap" in second.json()["error"]["message"]
    totals = gateway.close_trial(access.token)
    assert totals.stopped_by == stopped_by and totals.calls == 2 and totals.refused == 1


@pytest.mark.parametrize("smaller", ["run budget", "cell budget"])
def test_run_and_cell_budgets_are_shared_through_the_store(
    gateway: Gateway, store: Store, smaller: str
) -> None:
    """The run's budget_usd and a cell's cell_budget_usd: a call must fit in both, and the one
    it would pass is named (here both read the same spend; the other's limit is far above)."""
    reader = Store(store.path)
    limits = {"run budget": 1.0, "cell budget": 1.0, smaller: 2e-4}
    budget = Budgets([RunBudget(limit, lambda: reader.run_cost("r"), name)
                      for name, limit in limits.items()])  # fmt: skip
    one = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL}, budget=budget)
    two = gateway.open_trial("r.2", "r", keys={"anthropic": SENTINEL}, budget=budget)
    assert ask(one.base_url("127.0.0.1"), one.token, MODEL).status_code == 200
    gateway.close_trial(one.token)  # its cost is recorded
    late = ask(two.base_url("127.0.0.1"), two.token, MODEL)
    assert late.status_code == 400 and smaller in late.json()["error"]["message"]
    assert gateway.close_trial(two.token).stopped_by == smaller
    assert all(b._reserved == 0 for b in budget.budgets)  # the refused call holds nothing
    assert reader.run_cost("r") == pytest.approx((11 * 3 + 7 * 15 + 3 * 0.3 + 2 * 3.75) / 1e6)


def test_a_trial_whose_upstream_never_answers_is_unreachable(gateway: Gateway) -> None:
    access = gateway.open_trial("r.1", "r", provider="dead")
    for _ in range(2):
        assert ask(access.base_url("127.0.0.1"), access.token, MODEL).status_code == 502
    assert gateway.close_trial(access.token).is_unreachable


BASH_FUNCTION = {
    "type": "function",
    "name": "bash",
    "description": "run",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_openai_sdk_through_the_gateway_to_the_scripted_model(
    gateway: Gateway, store: Store, api: str, stream: bool
) -> None:
    access = gateway.open_trial("r.1", "r", script=(ShellStep("echo hi > out.txt"),))
    client = openai.OpenAI(
        base_url=access.base_url("127.0.0.1") + "/v1", api_key=access.token, max_retries=0
    )
    if api == "responses":
        request = {"model": "hemra/scripted", "input": "solve it", "tools": [BASH_FUNCTION]}
        if stream:
            with client.responses.stream(**request) as live:  # type: ignore[arg-type]
                response = live.get_final_response()
        else:
            response = client.responses.create(**request)  # type: ignore[arg-type]
        (call,) = [item for item in response.output if item.type == "function_call"]
        name, arguments = call.name, call.arguments
        wire = Wire.RESPONSES
    else:
        tool = {
            "type": "function",
            "function": {"name": "bash", "parameters": BASH_FUNCTION["parameters"]},
        }
        chat = {
            "model": "hemra/scripted",
            "tools": [tool],
            "messages": [{"role": "user", "content": "solve it"}],
        }
        if stream:
            pieces = list(
                client.chat.completions.create(
                    **chat, stream=True, stream_options={"include_usage": True}
                )
            )  # type: ignore[call-overload]
            name = next(
                p.choices[0].delta.tool_calls[0].function.name
                for p in pieces
                if p.choices and p.choices[0].delta.tool_calls
            )
            arguments = "".join(
                p.choices[0].delta.tool_calls[0].function.arguments or ""
                for p in pieces
                if p.choices and p.choices[0].delta.tool_calls
            )
        else:
            message = client.chat.completions.create(**chat).choices[0].message  # type: ignore[call-overload]
            name = message.tool_calls[0].function.name
            arguments = message.tool_calls[0].function.arguments
        wire = Wire.CHAT
    assert name == "bash" and "echo hi" in json.loads(arguments)["command"]
    (row,) = calls_of(gateway, store, access.token)
    expected = scripted_usage(wire)
    assert (row.wire, row.provider) == (wire.value, "scripted")
    assert (row.input_tokens, row.output_tokens, row.cache_read_tokens, row.cache_write_tokens) == (
        expected.input_tokens,
        expected.output_tokens,
        expected.cache_read_tokens,
        expected.cache_write_tokens,
    )
