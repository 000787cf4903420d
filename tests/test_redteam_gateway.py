"""The gateway attacked as an untrusted agent would: through a real gateway on loopback to a real
upstream (tests/upstream.py, which answers 200 on any path), with a real SQLite store. Every call
that is not a model call is refused and never forwarded; the real key never comes back; secrets
in headers are never stored; a bad token costs nothing; and a harness cannot ask for a key."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from conftest import TaskMaker
from pytest_hemra.execute.gateway.scrub import KeyScrubber
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.store import Store
from tests.upstream import MODEL, Upstream

SENTINEL = "sk-sentinel-redteam-4c9e1f7a"
BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


@pytest.mark.parametrize(
    ("method", "path", "headers", "error_type"),
    [
        ("GET", "/v1/files", {"authorization": "Bearer {token}"}, "permission_denied"),
        ("DELETE", "/v1/files/file-x", {"authorization": "Bearer {token}"}, "permission_denied"),
        ("POST", "/v1/messages/batches", {"x-api-key": "{token}", **ANTHROPIC_HEADERS}, None),
        ("POST", "/v1/fine_tuning/jobs", {"authorization": "Bearer {token}"}, "permission_denied"),
        ("HEAD", "/v1/messages", {"x-api-key": "{token}"}, None),
        # a model id of `..` would fold into /v1/files on its way upstream
        (
            "GET",
            "/v1/models/%2e%2e/files",
            {"authorization": "Bearer {token}"},
            "permission_denied",
        ),
        ("GET", "/v1/models/..%2Ffiles", {"authorization": "Bearer {token}"}, "permission_denied"),
    ],
)
def test_calls_that_are_not_model_calls_are_refused_403_recorded_and_never_forwarded(
    gateway: Gateway,
    store: Store,
    upstream: Upstream,
    method: str,
    path: str,
    headers: dict[str, str],
    error_type: str | None,
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL, "openai": SENTINEL})
    sent = {name: value.format(token=access.token) for name, value in headers.items()}
    body = json.dumps({"requests": [{"custom_id": "a", "params": BODY}]}).encode()
    response = requests.request(
        method, access.base_url("127.0.0.1") + path, data=body, headers=sent, timeout=10
    )

    assert response.status_code == 403
    if method != "HEAD":
        answer = response.json()
        if error_type is None:  # an Anthropic client gets Anthropic's error format
            assert answer["type"] == "error" and answer["error"]["type"] == "permission_error"
        else:
            assert answer["error"]["type"] == error_type
    gateway.close_trial(access.token)
    (row,) = store.calls(run_id="r")
    assert row.refused and row.status == 403 and row.trial_id == "r.1"
    assert "is not a model call the gateway forwards" in (row.error or "")
    assert row.request_bytes == 0  # refused before its body was read
    assert upstream.seen == []


def test_model_listing_is_forwarded_and_model_calls_still_work(
    gateway: Gateway, store: Store, upstream: Upstream
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"openai": SENTINEL})
    auth = {"authorization": f"Bearer {access.token}"}
    base = access.base_url("127.0.0.1")
    for path in ("/v1/models", f"/v1/models/{MODEL}"):
        assert requests.get(base + path, headers=auth, timeout=10).status_code == 200
    gateway.close_trial(access.token)
    assert [s["path"] for s in upstream.seen] == ["/v1/models", f"/v1/models/{MODEL}"]
    assert [row.refused for row in store.calls(run_id="r")] == [False, False]


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_that_echoes_the_key_never_shows_it_to_the_agent_store_or_trial_folder(
    gateway: Gateway, store: Store, upstream: Upstream, tmp_path: Path, stream: bool
) -> None:
    calls_dir = tmp_path / "trial" / "calls"
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL}, calls_dir=calls_dir)
    response = requests.post(
        access.base_url("127.0.0.1") + "/v1/messages",
        json={**BODY, "stream": stream},
        headers={"x-api-key": access.token, "x-test-mode": "echo-key", **ANTHROPIC_HEADERS},
        timeout=10,
    )
    gateway.close_trial(access.token)

    assert upstream.seen[0]["headers"]["x-api-key"] == SENTINEL  # it did get the key
    assert SENTINEL not in response.text and "[redacted]" in response.text
    assert SENTINEL not in json.dumps(dict(response.headers))
    assert response.headers["x-echo"] == "[redacted]"
    (row,) = store.calls(run_id="r")
    assert row.status == (200 if stream else 401)
    if not stream:
        assert "[redacted]" in (row.error or "")
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "0001.response" for p in written)
    for path in written:  # the trial folder and the SQLite store (and its journal)
        assert SENTINEL.encode() not in path.read_bytes(), path


def test_a_key_cut_at_any_point_across_chunks_is_scrubbed() -> None:
    body = f'data: {{"message": "{SENTINEL}"}}\n\n'.encode() * 2
    for cut in range(len(body) + 1):
        for second in (cut, min(cut + 3, len(body))):
            scrubber = KeyScrubber([SENTINEL])
            pieces = (body[:cut], body[cut:second], body[second:])
            out = b"".join(scrubber.feed(p) for p in pieces) + scrubber.flush()
            assert out == body.replace(SENTINEL.encode(), b"[redacted]"), cut
    live = KeyScrubber([SENTINEL])
    assert live.feed(b"data: {}\n\n") == b"data: {}\n\n"  # nothing held that cannot be a key


def test_secret_headers_are_stored_redacted_and_never_forwarded(
    gateway: Gateway, store: Store, upstream: Upstream
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL})
    sent = {
        "x-api-key": access.token,
        "x-goog-api-key": "AIza-smuggled-key",
        "proxy-authorization": "Basic c2VjcmV0",
        "x-session-id": "session-1234",
        "Cookie": "sid=abc",
        "X-Upstream-Token": "tok-smuggled",
        "x-client-secret": "shh",
        "openai-organization": "org-someone-else",
        "x-innocent": f"carries {access.token}",
        "x-custom-note": "kept",
        **ANTHROPIC_HEADERS,
    }
    response = requests.post(
        access.base_url("127.0.0.1") + "/v1/messages", json=BODY, headers=sent, timeout=10
    )
    assert response.status_code == 200
    gateway.close_trial(access.token)

    (row,) = store.calls(run_id="r")
    for name in (
        "x-api-key",
        "x-goog-api-key",
        "proxy-authorization",
        "x-session-id",
        "cookie",
        "x-upstream-token",
        "x-client-secret",
        "x-innocent",
    ):
        assert row.headers[name] == "[redacted]", name
    assert row.headers["x-custom-note"] == "kept"
    stored = json.dumps(row.headers)
    for secret in ("AIza", "c2VjcmV0", "session-1234", "sid=abc", "tok-smuggled", "shh"):
        assert secret not in stored
    assert access.token not in stored
    (seen,) = upstream.seen
    forwarded = {name.lower(): value for name, value in seen["headers"].items()}
    assert forwarded["x-api-key"] == SENTINEL  # the only key the upstream sees
    for name in (
        "x-goog-api-key",
        "proxy-authorization",
        "cookie",
        "x-upstream-token",
        "x-client-secret",
        "openai-organization",
        "x-innocent",
        "authorization",
    ):
        assert name not in forwarded, name
    assert forwarded["x-custom-note"] == "kept"
    assert forwarded["x-session-id"] == "session-1234"  # no credential: prompt caching uses it


def send_huge_body(url: str, path: str, headers: dict[str, str]) -> tuple[bytes, int, float]:
    """Announce a 60 MB body, send only its first MiB, and wait for the answer: what came back,
    how many body bytes were sent, and how long the answer took."""
    host, port = url.removeprefix("http://").split(":")
    announced = 60 * 1024 * 1024
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        + f"Content-Length: {announced}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(head.encode())
        started = time.perf_counter()
        sent = 0
        piece = b"x" * 65536
        while sent < 1024 * 1024:
            connection.sendall(piece)
            sent += len(piece)
        connection.settimeout(5)
        answer = connection.recv(65536)
        return answer, sent, time.perf_counter() - started


@pytest.mark.parametrize("why", ["unknown", "ended", "not a model call"])
def test_a_60_mb_body_refused_for_its_token_or_path_is_never_read(
    gateway: Gateway, store: Store, upstream: Upstream, why: str
) -> None:
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL})
    token = "hemra-guessed" if why == "unknown" else access.token
    if why == "ended":
        gateway.close_trial(access.token)
    path = "/v1/files" if why == "not a model call" else "/v1/messages"
    answer, sent, took = send_huge_body(
        gateway.base_urls["127.0.0.1"], f"/t/{token}{path}", {"x-api-key": token}
    )

    status = 403 if why == "not a model call" else 401
    assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer[:200]
    assert sent == 1024 * 1024 and took < 2.0  # answered with 59 of the 60 MB never sent
    gateway.close_trial(access.token)
    (row,) = store.calls()
    assert row.refused and row.request_bytes == 0
    assert upstream.seen == []


def test_a_harness_env_naming_a_provider_key_is_refused_at_resolve_and_nothing_recorded(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SENTINEL)
    monkeypatch.setenv("MY_LOCAL_KEY", SENTINEL)
    make_task("hello")
    write_harness("greedy", 'kind = "program"\ncommand = ["true"]\nenv = ["ANTHROPIC_API_KEY"]\n')
    write_harness(
        "sly", 'kind = "program"\ncommand = ["true"]\nenv = ["HOME_DIR", "MY_LOCAL_KEY"]\n'
    )
    monkeypatch.setenv("HOME_DIR", "/x")
    for name, key, extra in (
        ("greedy", "ANTHROPIC_API_KEY", ""),
        (
            "sly",
            "MY_LOCAL_KEY",
            '[providers.local]\nbase_url = "http://127.0.0.1:9"\nkey_env = "MY_LOCAL_KEY"\n',
        ),
    ):
        run_file = tmp_path / "run.toml"
        run_file.write_text(f'harnesses = ["{name}"]\ndatasets = ["ds"]\n{extra}')
        result = pytester.runpytest("--hemra-run", str(run_file))
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        errors = [line for line in result.errlines if line.startswith("ERROR:")]
        assert len(errors) == 1, result.errlines
        assert f"{name}.toml: key 'env': {key} holds a model provider's key" in errors[0]
        assert SENTINEL not in result.stdout.str() + result.stderr.str()
        assert not (pytester.path / ".hemra").exists()


# the verifier asks the gateway for a model by hand (bash's /dev/tcp: the image has no curl) and
# scores 1 only when the scripted reply comes back and no key is in its environment
ASKS_A_MODEL = r"""
url="${HEMRA_BASE_URL#http://}"; hostport="${url%%/*}"; path="/${url#*/}"
body='{"model":"hemra/scripted","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
reply=""
if exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}"; then
    head='POST %s/v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\n'
    head+='anthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n'
    head+='content-length: %d\r\nconnection: close\r\n\r\n%s'
    printf "$head" "$path" "$hostport" "$HEMRA_API_KEY" "${#body}" "$body" >&3
    reply="$(timeout 20 cat <&3)"
fi
echo "$reply" | tail -c 400
case "$reply" in *"a scripted reply to the verifier"*) ok=1 ;; *) ok=0 ;; esac
[ "$(env | grep -c sk-sentinel)" = 0 ] || ok=0
echo $ok > /logs/verifier/reward.txt
"""


def test_a_provider_key_never_reaches_a_verifier_which_gets_the_gateway_as_judges_do(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    docker_test: None,
) -> None:
    """A run's `[verifier] env` naming a provider's key is refused at resolve (the verifier runs
    code the agent left: a key there is the agent's); `[verifier] model_access = true` gives the
    verifier the gateway's URL and a token of the trial's instead, its calls recorded apart."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", SENTINEL)
    make_task("judged", test=ASKS_A_MODEL)
    write_harness("nothing", 'kind = "program"\ncommand = ["true"]\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["nothing"]\ndatasets = ["ds"]\n[verifier]\nenv = ["ANTHROPIC_API_KEY"]\n'
    )
    refused = pytester.runpytest("--hemra-run", str(run_file))
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in refused.errlines if line.startswith("ERROR:")]
    assert "key 'verifier.env': ANTHROPIC_API_KEY holds a model provider's key" in errors[0]
    assert "[verifier] model_access = true" in errors[0]
    assert not (pytester.path / ".hemra").exists()

    run_file.write_text(
        'harnesses = ["nothing"]\ndatasets = ["ds"]\nmodel = "hemra/scripted"\n'
        "[verifier]\nmodel_access = true\n"
    )
    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=1)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    (trial,) = store.trials(run.id)
    folder = Path(trial.trial_dir or "")
    usage = json.loads((folder / "verifier" / "usage.json").read_text())
    assert usage["calls"] == 1
    assert SENTINEL not in (folder / "verifier" / "stdout.txt").read_text()


def test_call_bodies_past_the_trials_cap_are_not_kept_and_the_cut_is_noted(
    gateway: Gateway,
    store: Store,
    upstream: Upstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a harness making call after call cannot fill the runner's disk through its trial folder
    monkeypatch.setattr("pytest_hemra.execute.gateway.server.KEPT_TRIAL_BYTES", 1500)
    calls_dir = tmp_path / "trial" / "calls"
    access = gateway.open_trial("r.1", "r", keys={"anthropic": SENTINEL}, calls_dir=calls_dir)
    for _ in range(6):
        response = requests.post(
            access.base_url("127.0.0.1") + "/v1/messages",
            json=BODY,
            headers={"x-api-key": access.token, **ANTHROPIC_HEADERS},
            timeout=10,
        )
        assert response.status_code == 200
    gateway.close_trial(access.token)
    assert len(store.calls(run_id="r")) == 6  # every call recorded
    kept = sorted(path.name for path in calls_dir.glob("*.request.json"))
    assert 0 < len(kept) < 6
    kept_bytes = sum(path.stat().st_size for path in calls_dir.iterdir() if path.suffix != ".txt")
    assert kept_bytes <= 1500
    note = (calls_dir / "over-cap.txt").read_text()
    assert note.startswith(f"bodies of call {len(kept) + 1} and later not kept")


# an offline task's agent keeps the gateway's address and its token where test.sh finds them
SAVES_ITS_TOKEN = (
    'kind = "program"\ncommand = ["sh", "-c",'
    ' "printf \\"HEMRA_BASE_URL=%s\\\\nHEMRA_API_KEY=%s\\\\n\\" $HEMRA_BASE_URL $HEMRA_API_KEY'
    ' > /app/creds"]\n'
)


def test_a_verifier_handed_the_agents_token_reaches_no_model(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    docker_test: None,
) -> None:
    """An agent leaves the gateway's address and its token in /app for test.sh, which asks the
    gateway for a model with them: no reply (the token ended with the agent's turn, and the
    verifier's network, by default, is cut), so nothing of the agent's reaches a model."""
    make_task(
        "offline",
        test="set -a; . /app/creds; set +a\n" + ASKS_A_MODEL,
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\n",  # a root agent, as Harbor's
        task_toml="[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 30\n"
        "[environment]\nallow_internet = false\n",
    )
    write_harness("saver", SAVES_ITS_TOKEN)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["saver"]\ndatasets = ["ds"]\nmodel = "hemra/scripted"\n')
    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(failed=1)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    (trial,) = store.trials(run.id)
    assert trial.reward == 0.0
    folder = Path(trial.trial_dir or "")
    assert "HEMRA_API_KEY=" in (folder / "diff.patch").read_text()  # the agent left its token
    said = (folder / "verifier" / "stdout.txt").read_text()
    assert "a scripted reply" not in said, said
