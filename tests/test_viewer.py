"""The viewer, for real: an aiohttp server on loopback over a real store, its JSON API, and its
pages driven in headless Chromium (Debian's, through Playwright), with screenshots kept.

Nothing here needs Docker: the viewer reads the store and the trial folders. Under CI=true a
missing Chromium (or Playwright) fails the browser tests; elsewhere they skip.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from pytest_hemra.core.events import ENGINE_KEPT
from pytest_hemra.core.records import CallRow, PlannedTrial
from pytest_hemra.report.tables import build_report, report_dict
from pytest_hemra.store import Store
from pytest_hemra.viewer.server import ViewerThread
from tests.records import sql, trial_result

TASKS = ["alpha", "beta", "gamma"]
HARNESSES = ["base", "rival"]
SCRIPT = "<script>alert(1)</script>"
INSTRUCTION = 'Fix <b>the</b> bug <img src=x onerror="alert(2)"> & <script>alert(3)</script>'
ODD_FILE = "<img src=x onerror=alert(4)>.txt"  # a file name is untrusted text too
ESC_FILE = "esc\x1b[31mred\r.txt"  # control characters: shown as symbols, never raw
CONTROL_TEXT = "\x1b[2Jcleared\rhidden\n"


@dataclass
class Fixture:
    store: Store
    done: str  # a finished run
    live: str  # a queued run nothing has run yet
    root: Path


def result(outcome: str, reward: float | None, trial_dir: Path) -> dict[str, Any]:
    return {
        "outcome": outcome, "reward": reward,
        "rewards": {} if reward is None else {"reward": reward, "style": 0.5},
        "exit_code": 0, "error": None if reward is not None else "docker: the engine said 100%_no",
        "finished_at": 1.0, "duration": 12.5,
        "phases": {"sandbox": 1.5, "agent": 9.0, "verifier": 2.0},
        "trial_dir": str(trial_dir),
        "usage": {
            "calls": 1, "input_tokens": 100, "output_tokens": 50, "cache_read_tokens": 7,
            "cache_write_tokens": 3, "cost": 0.01, "models": ["scripted-model-x"],
        },
    }  # fmt: skip


def spec(datasets: Path) -> dict[str, Any]:
    return {
        "spec": {"harnesses": HARNESSES, "baseline": "base", "model": "m-1", "timeout_secs": 600,
                 "attempts": 2},
        "datasets": {"ds": {"digest": "d" * 64, "path": str(datasets), "tasks": TASKS}},
        "harnesses": {h: {"digest": h[0] * 64} for h in HARNESSES},
    }  # fmt: skip


def write_folder(folder: Path, trial: Any) -> None:
    (folder / "agent").mkdir(parents=True)
    (folder / "verifier").mkdir()
    first = trial.task == "alpha" and trial.harness == "base" and trial.attempt == 1
    (folder / "agent" / "stdout.txt").write_text(
        f"{SCRIPT}\nran {trial.item_id}\n{CONTROL_TEXT}" if first else "ok\n"
    )
    (folder / "agent" / "stderr.txt").write_text("")
    (folder / "verifier" / "stdout.txt").write_text("1 passed\n")
    (folder / "diff.patch").write_text("--- a/app.py\n+++ b/app.py\n@@ -1 +1 @@\n-bug\n+fixed\n")
    (folder / ODD_FILE).write_text("odd name\n")
    (folder / ESC_FILE).write_text("escaped name\n")
    trajectory = {
        "schema_version": 1, "format": "hemra-trajectory/1", "wire": "anthropic-messages",
        "main_call": 1,
        "messages": [
            {"role": "user", "text": INSTRUCTION},
            {"role": "assistant", "tool_calls": [
                {"id": "toolu_1", "name": "bash",
                 "arguments": '{"command": "sed -i s/bug/fixed/ app.py"}'}
            ]},
            {"role": "tool", "tool_call_id": "toolu_1", "output": SCRIPT},
            {"role": "assistant", "text": "Fixed the bug."},
        ],
        "calls": [],
    }  # fmt: skip
    (folder / "trajectory.json").write_text(json.dumps(trajectory))


def call(run_id: str, trial_id: str) -> CallRow:
    return CallRow(
        run_id=run_id, trial_id=trial_id, at=1.0, provider="scripted", wire="anthropic-messages",
        method="POST", path="/v1/messages", model_requested="m-1", model="scripted-model-x",
        status=200, input_tokens=100, output_tokens=50, cache_read_tokens=7, cache_write_tokens=3,
        cost=0.01, latency=0.25, ttfb=0.05, request_bytes=900, response_bytes=400, error=None,
        refused=False, headers={}, role="agent",
    )  # fmt: skip


def make_store(root: Path, *, live: bool = True) -> Fixture:
    datasets = root / "datasets" / "ds"
    for task in TASKS:
        (datasets / task).mkdir(parents=True)
        (datasets / task / "instruction.md").write_text(INSTRUCTION if task == "alpha" else task)
    store = Store(root / ".hemra" / "hemra.db")
    plan = [PlannedTrial("ds", t, h, a) for t in TASKS for h in HARNESSES for a in (1, 2)]
    suffix = uuid.uuid4().hex[:8]
    done, queued = f"done-{suffix}", f"live-{suffix}"
    trials_dir = root / ".hemra" / "runs" / done
    store.record_plan(done, "finished run", spec(datasets), trials_dir, plan)
    for trial in store.trials(done):
        folder = trials_dir / "ds" / trial.task / f"{trial.harness}-{trial.attempt}"
        write_folder(folder, trial)
        store.record_call(call(done, trial.id))
        if trial.harness == "base" or trial.task == "alpha":
            store.finish_trial(trial.id, trial_result(result("pass", 1.0, folder)))
        elif trial.task == "gamma" and trial.attempt == 2:
            store.finish_trial(trial.id, trial_result(result("infra_error", None, folder)))
        else:
            store.finish_trial(trial.id, trial_result(result("fail", 0.0, folder)))
    if live:
        live_dir = root / ".hemra" / "runs" / queued
        store.record_plan(queued, "live run", spec(datasets), live_dir, plan, status="queued")
    return Fixture(store, done, queued, root)


@pytest.fixture
def fixture(tmp_path: Path) -> Fixture:
    return make_store(tmp_path)


@pytest.fixture
def viewer(fixture: Fixture) -> Iterator[str]:
    """The viewer on loopback over the fixture's store; its base URL."""
    thread = ViewerThread(fixture.store.path, "127.0.0.1", 0)
    thread.start()
    try:
        yield thread.url.rstrip("/")
    finally:
        thread.stop()


def get(base: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    return request(base, "GET", path, headers=headers)


def request(
    base: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    port = base.rsplit(":", 1)[1]
    connection = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        raw = response.read()
        if response.getheader("Content-Type", "").startswith("application/json"):
            return response.status, json.loads(raw)
        return response.status, raw.decode()
    finally:
        connection.close()


# -- the JSON API --------------------------------------------------------------------------------


def test_runs_list_every_run_with_its_progress(fixture: Fixture, viewer: str) -> None:
    status, data = get(viewer, "/api/runs")
    assert status == 200
    runs = {run["id"]: run for run in data["runs"]}
    assert runs[fixture.done]["progress"] == {
        "queued": 0, "running": 0, "finished": 12, "cancelled": 0, "deselected": 0, "total": 12,
        "left": 0,
    }  # fmt: skip
    assert runs[fixture.done]["outcomes"] == {"fail": 3, "infra_error": 1, "pass": 8}
    assert runs[fixture.live]["progress"]["queued"] == 12 and runs[fixture.live]["is_active"]
    assert runs[fixture.done]["harnesses"] == HARNESSES and not runs[fixture.done]["is_active"]


def test_the_runs_page_names_what_the_engine_kept_as_the_last_runner_found_it(
    fixture: Fixture, viewer: str
) -> None:
    assert get(viewer, "/api/runs")[1]["engine_kept"] == {}
    kept = {"network hemra-x": "containers not HEMRA's sit on it (web); disconnect them"}
    fixture.store.record_event(fixture.done, None, ENGINE_KEPT, {"stuck": kept})
    assert get(viewer, "/api/runs")[1]["engine_kept"] == kept
    fixture.store.record_event(fixture.live, None, ENGINE_KEPT, {"stuck": {}})  # removed since
    assert get(viewer, "/api/runs")[1]["engine_kept"] == {}


def test_deselected_trials_are_not_counted_and_an_interrupted_run_says_what_is_left(
    fixture: Fixture, viewer: str
) -> None:
    store, run_id = fixture.store, fixture.live
    trials = store.trials(run_id)
    store.deselect_trials(run_id, [t.item_id for t in trials if t.harness == "rival"])  # -k base
    kept = [t for t in trials if t.harness == "base"]
    for trial in kept[:2]:
        store.finish_trial(trial.id, trial_result(result("pass", 1.0, fixture.root)))
    _, run = get(viewer, f"/api/runs/{run_id}")
    progress = run["progress"]
    assert (progress["finished"], progress["deselected"], progress["total"]) == (2, 6, 6)
    assert progress["left"] == 4

    assert store.claim(kept[2].id, "gw0@here:1", 30).is_leased
    assert store.interrupt_run(run_id) == 4  # Ctrl-C: the running one and the planned ones
    _, data = get(viewer, "/api/runs")
    (listed,) = [r for r in data["runs"] if r["id"] == run_id]
    assert (listed["status"], listed["is_active"]) == ("interrupted", False)
    assert listed["progress"]["cancelled"] == 4 and listed["progress"]["left"] == 4


def test_a_run_whose_trial_waits_for_its_engine_shows_waiting_until_it_answers(
    fixture: Fixture, viewer: str
) -> None:
    store = fixture.store
    trial = store.trials(fixture.live)[0]
    assert store.claim(trial.id, "gw0@elsewhere:1", 30).state == "leased"
    down = {"engine": "tcp://box2:2375", "error": "Connection refused"}
    store.record_event(fixture.live, trial.id, "engine_down", down)
    for path in ("/api/runs", f"/api/runs/{fixture.live}"):
        status, data = get(viewer, path)
        run = next(r for r in data["runs"] if r["id"] == fixture.live) if "runs" in data else data
        assert (status, run["status"], run["is_active"]) == (200, "waiting", True)
        (wait,) = run["waiting"]
        assert (wait["engine"], wait["trials"], wait["error"]) == (
            "tcp://box2:2375", 1, "Connection refused"
        )  # fmt: skip
    store.record_event(fixture.live, trial.id, "engine_back", {**down, "waited": 3.0})
    _, run = get(viewer, f"/api/runs/{fixture.live}")
    assert (run["status"], run["waiting"]) == ("running", [])


def test_trials_page_by_cursor_and_filter(fixture: Fixture, viewer: str) -> None:
    base = f"/api/runs/{fixture.done}/trials"
    seen, cursor = [], None
    while True:
        status, page = get(viewer, f"{base}?limit=5" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200 and page["total"] == 12
        seen += [t["id"] for t in page["trials"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [t.id for t in fixture.store.trials(fixture.done)]
    _, by_offset = get(viewer, f"{base}?limit=4&offset=8")
    assert [t["id"] for t in by_offset["trials"]] == seen[8:]

    def matching(query: str) -> list[str]:
        status, page = get(viewer, f"{base}?{query}")
        assert status == 200, page
        assert page["total"] == len(page["trials"])
        return [t["item_id"] for t in page["trials"]]

    assert matching("harness=rival&outcome=fail") == [
        "ds::beta[rival-1]", "ds::beta[rival-2]", "ds::gamma[rival-1]",
    ]  # fmt: skip
    assert matching("task=gamma&harness=rival") == ["ds::gamma[rival-1]", "ds::gamma[rival-2]"]
    assert matching("text=100%25_no") == ["ds::gamma[rival-2]"]  # in the error, % and _ literal
    assert matching("text=100%25_yes") == []
    assert matching("text=ALPHA%5Bbase") == ["ds::alpha[base-1]", "ds::alpha[base-2]"]
    _, live = get(viewer, f"/api/runs/{fixture.live}/trials?outcome=planned&limit=1")
    assert live["total"] == 12 and live["next_cursor"] is not None
    status, bad = get(viewer, f"{base}?outcome=won")
    assert status == 400 and "expected one of pass, fail" in bad["error"]
    status, bad = get(viewer, f"{base}?limit=5000")
    assert status == 400 and "expected 1..1000" in bad["error"]
    status, bad = get(viewer, f"{base}?cursor={fixture.live}.00001")
    assert status == 400 and "is not a trial of run" in bad["error"]
    status, missing = get(viewer, "/api/runs/nope/trials")
    assert status == 404 and "no run 'nope'" in missing["error"]


def test_report_is_the_report_module_s_built_once_per_state(fixture: Fixture, viewer: str) -> None:
    status, first = get(viewer, f"/api/runs/{fixture.done}/report")
    assert status == 200 and first["cached"] is False
    expected = json.loads(json.dumps(report_dict(build_report(fixture.store, fixture.done))))
    assert first["report"] == expected
    (table,) = first["tables"]
    assert table["headers"][:4] == ["harness", "trials", "passes", "mean reward [95% CI]"]
    assert table["rows"][0][0] == "base (baseline)"
    assert {f["kind"] for f in table["flags"]} >= {"unfinished"}
    assert [bar["label"] for bar in table["chart"]["bars"]] == ["base (baseline)", "rival"]
    _, again = get(viewer, f"/api/runs/{fixture.done}/report")
    assert again["cached"] is True and again["report"] == first["report"]
    status, untouched = get(viewer, f"/api/runs/{fixture.live}/report")
    assert status == 200  # nothing scored yet: no difference from the baseline, and no error
    assert untouched["report"]["datasets"][0]["harnesses"][1]["versus"] is None
    live = fixture.store.trials(fixture.live)[0]
    fixture.store.finish_trial(live.id, trial_result(result("pass", 1.0, fixture.root)))
    _, changed = get(viewer, f"/api/runs/{fixture.live}/report")
    assert changed["cached"] is False
    harnesses = changed["report"]["datasets"][0]["harnesses"]
    assert harnesses[0]["passes"] == 1 and harnesses[1]["versus"] is None


def test_a_trial_with_its_calls_transcript_and_paged_files(fixture: Fixture, viewer: str) -> None:
    trial = fixture.store.trials(fixture.done)[0]
    status, data = get(viewer, f"/api/trials/{trial.id}")
    assert status == 200
    assert data["trial"]["item_id"] == "ds::alpha[base-1]" and data["trial"]["outcome"] == "pass"
    assert data["trial"]["rewards"] == {"reward": 1.0, "style": 0.5}
    assert data["phases"] == {"sandbox": 1.5, "agent": 9.0, "verifier": 2.0}
    assert data["usage"]["cache_read_tokens"] == 7 and data["usage"]["tokens"] == 160
    assert data["instruction"] == {"text": INSTRUCTION, "truncated": False, "error": None}
    assert {"agent/stdout.txt", "diff.patch", "trajectory.json", ODD_FILE} <= {
        f["path"] for f in data["files"]
    }
    _, calls = get(viewer, f"/api/trials/{trial.id}/calls")
    (only,) = calls["calls"]
    assert only["model"] == "scripted-model-x" and only["latency"] == 0.25 and "headers" not in only
    _, transcript = get(viewer, f"/api/trials/{trial.id}/transcript?offset=1&limit=2")
    assert transcript["total"] == 4
    assert [m["role"] for m in transcript["messages"]] == ["assistant", "tool"]
    _, chunk = get(viewer, f"/api/trials/{trial.id}/files/agent/stdout.txt?offset=0&limit=10")
    assert chunk["text"] == SCRIPT[:10] and chunk["next_offset"] == 10 and not chunk["is_binary"]


def test_large_files_are_paged_by_byte_offset_on_whole_characters(
    fixture: Fixture, viewer: str
) -> None:
    trial = fixture.store.trials(fixture.done)[1]
    content = ("héllo wörld ✓ 日本語 " * 20_000).encode()  # ~600 KB, multibyte throughout
    Path(trial.trial_dir or "", "agent", "stdout.txt").write_bytes(content)
    pieces, offset, reads = [], 0, 0
    while offset is not None:
        path = f"/api/trials/{trial.id}/files/agent/stdout.txt?offset={offset}&limit=65536"
        status, chunk = get(viewer, path)
        assert status == 200 and chunk["length"] <= 65536 and chunk["size"] == len(content)
        pieces.append(chunk["text"])
        offset, reads = chunk["next_offset"], reads + 1
    assert "".join(pieces) == content.decode() and "\ufffd" not in "".join(pieces)
    assert reads >= len(content) // 65536
    status, bad = get(viewer, f"/api/trials/{trial.id}/files/agent/stdout.txt?limit=2000000")
    assert status == 400 and "expected 1..1048576" in bad["error"]


def test_files_outside_the_trial_folder_are_refused(fixture: Fixture, viewer: str) -> None:
    trial = fixture.store.trials(fixture.done)[0]
    folder = Path(trial.trial_dir or "")
    (folder / "escape.txt").symlink_to(fixture.store.path)
    base = f"/api/trials/{trial.id}/files"
    for path, expected in (
        ("../../../../hemra.db", "outside the trial folder"),
        ("%2e%2e/%2e%2e/%2e%2e/%2e%2e/hemra.db", "outside the trial folder"),
        ("escape.txt", "outside the trial folder"),
        ("/etc/passwd", "expected a path relative to the trial folder"),
        ("nothing.txt", "not in the trial folder"),
    ):
        status, data = get(viewer, f"{base}/{path}")
        assert status in (400, 404) and expected in data["error"], path
    # a trial whose folder the store puts outside the run's trials folder is not read at all
    statement = "UPDATE trials SET trial_dir = :folder WHERE id = :trial"
    sql(fixture.store, statement, folder=str(fixture.root), trial=trial.id)
    status, data = get(viewer, f"{base}/datasets/ds/alpha/instruction.md")
    assert status == 404 and "outside the run's trials folder" in data["error"]


def test_compare_two_harnesses_and_two_runs(fixture: Fixture, viewer: str) -> None:
    status, data = get(viewer, f"/api/compare/harnesses?run={fixture.done}&a=base&b=rival")
    assert status == 200
    (dataset,) = data["datasets"]
    assert dataset["a"]["mean"] == 1.0 and dataset["change"]["n_tasks"] == 3
    assert dataset["change"]["diff"] == pytest.approx((0 - 1 + 0 - 1 + 0) / 3 + 0, abs=0.2)
    rows = {row["task"]: row for row in dataset["tasks"]}
    assert rows["beta"]["b_mean"] == 0.0 and rows["alpha"]["diff"] == 0.0
    assert [c["outcome"] for c in rows["gamma"]["b"]] == ["fail", "infra_error"]
    status, data = get(viewer, f"/api/compare/runs?before={fixture.done}&after={fixture.done}")
    assert status == 200 and data["harness"] == "base" and data["comparison"] is not None
    assert data["comparison"]["datasets"][0]["harnesses"][0]["change"]["diff"] == 0.0
    status, bad = get(viewer, f"/api/compare/harnesses?run={fixture.done}&a=base&b=nobody")
    assert status == 400 and "expected one of ['base', 'rival']" in bad["error"]
    status, bad = get(viewer, "/api/compare/runs?before=x")
    assert status == 400 and "parameter 'after' is required" in bad["error"]


def test_cancel_is_a_same_origin_json_post_and_cancels_like_hemra_cancel(
    fixture: Fixture, viewer: str
) -> None:
    path = f"/api/runs/{fixture.live}/cancel"
    status, data = request(viewer, "POST", path, b"wait=0", {"Content-Type": "text/plain"})
    assert status == 415 and "expected Content-Type application/json" in data["error"]
    json_headers = {"Content-Type": "application/json"}
    status, data = request(
        viewer, "POST", path, b"{}", {**json_headers, "Origin": "http://evil.example"}
    )
    assert status == 403 and "expected this viewer's own address" in data["error"]
    assert fixture.store.run(fixture.live).status == "queued"
    status, data = request(viewer, "POST", path, b'{"wait": 0}', json_headers)
    assert status == 200 and data["cancelled"] == 12, data
    assert fixture.store.run(fixture.live).status == "cancelled"
    assert {t.outcome for t in fixture.store.trials(fixture.live)} == {"cancelled"}


def test_pages_allow_only_the_viewer_s_own_scripts(viewer: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", int(viewer.rsplit(":", 1)[1]))
    connection.request("GET", "/")
    response = connection.getresponse()
    assert response.status == 200 and 'src="/static/js/main.js"' in response.read().decode()
    policy = response.getheader("Content-Security-Policy") or ""
    assert "script-src 'self';" in policy and "default-src 'self'" in policy
    assert response.getheader("X-Content-Type-Options") == "nosniff"
    connection.close()


def test_loopback_viewer_answers_only_loopback_host_names(viewer: str) -> None:
    status, data = get(viewer, "/api/runs", {"Host": "rebound.example:8765"})
    assert status == 403 and "expected 127.0.0.1, localhost or [::1]" in data["error"]
    assert get(viewer, "/api/runs", {"Host": "localhost:8765"})[0] == 200


def test_beyond_loopback_every_request_needs_the_token(
    fixture: Fixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEMRA_VIEWER_TOKEN", raising=False)
    thread = ViewerThread(fixture.store.path, "0.0.0.0", 0)
    thread.start()
    try:
        assert thread.token is not None and "every request needs" in thread.announcement()
        base = f"http://127.0.0.1:{thread.port}"
        for path in ("/api/runs", "/", f"/runs/{fixture.done}", "/static/js/main.js"):
            status, data = get(base, path)
            assert status == 401 and "needs its token" in data["error"], path
        status, _ = get(base, "/api/runs", {"Authorization": "Bearer wrong"})
        assert status == 401
        status, data = get(base, "/api/runs", {"Authorization": f"Bearer {thread.token}"})
        assert status == 200 and len(data["runs"]) == 2
        connection = http.client.HTTPConnection("127.0.0.1", thread.port, timeout=30)
        connection.request("GET", f"/?token={thread.token}")
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        cookie = (response.getheader("Set-Cookie") or "").split(";")[0]
        assert cookie.startswith("hemra_viewer_token=")
        assert get(base, "/api/runs", {"Cookie": cookie})[0] == 200
    finally:
        thread.stop()


def test_hemra_view_prints_its_token_and_stops_on_sigterm(fixture: Fixture) -> None:
    env = {**os.environ, "HEMRA_VIEWER_TOKEN": "s3cret-token"}
    argv = [
        sys.executable,
        "-m",
        "pytest_hemra.cli",
        "view",
        "--store",
        str(fixture.store.path),
    ]
    child = subprocess.Popen(
        [*argv, "--host", "0.0.0.0", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        found = re.search(r"http://0\.0\.0\.0:(\d+)/\?token=s3cret-token", first)
        assert found, first
        assert "every request needs this token" in child.stdout.readline()
        base = f"http://127.0.0.1:{found.group(1)}"
        assert get(base, "/api/runs")[0] == 401
        assert get(base, "/api/runs", {"Authorization": "Bearer s3cret-token"})[0] == 200
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=15) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.slow
def test_hemra_serve_runs_the_viewer_beside_the_queue(tmp_path: Path) -> None:
    """A store with nothing queued: the server serves the viewer, and SIGTERM stops both."""
    finished = make_store(tmp_path, live=False)
    argv = [
        sys.executable,
        "-m",
        "pytest_hemra.cli",
        "serve",
        "--store",
        str(finished.store.path),
    ]
    child = subprocess.Popen(
        [*argv, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=tmp_path,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        found = re.search(r"hemra viewer: http://127\.0\.0\.1:(\d+)/$", child.stdout.readline())
        assert found
        status, data = get(f"http://127.0.0.1:{found.group(1)}", "/api/runs")
        assert status == 200 and [r["id"] for r in data["runs"]] == [finished.done]
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=15) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    once = subprocess.run(
        [*argv, "--port", "0", "--once"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert once.returncode == 0 and "hemra viewer: http://127.0.0.1:" in once.stdout


def test_the_api_example_script_lists_progress_and_failing_trials(
    fixture: Fixture, viewer: str
) -> None:
    script = REPO / "examples" / "viewer" / "progress.py"
    argv = [sys.executable, str(script), "--url", viewer, "--run", fixture.done]
    done = subprocess.run([*argv, "--harness", "rival"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(fixture.live in line and "0/12 done" in line for line in lines)
    assert any(fixture.done in line and "12/12 done" in line for line in lines)
    failing = [line for line in lines if line.startswith("  ds::")]
    assert [line.split()[0] for line in failing] == [
        "ds::beta[rival-1]", "ds::beta[rival-2]", "ds::gamma[rival-1]",
    ]  # fmt: skip
    assert all("'ok'" in line for line in failing) and lines[-1] == "3 of 3 matching trials"


# -- the pages, in headless Chromium -------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if chromium is None or sync_playwright is None:
        # a missing browser fails, as the HTML report's test does (`tox` names it up front)
        pytest.fail(
            "needs Debian's chromium (apt-get install chromium) and Playwright for Python"
            " (pip install -e '.[dev]')"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page that records every dialog and script error it sees. The viewer's content security
    policy is bypassed: Playwright's own waits evaluate strings, and the escaping must hold
    without the policy's help."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
    opened = context.new_page()
    opened.dialogs, opened.errors = [], []
    opened.on("dialog", lambda dialog: (opened.dialogs.append(dialog.message), dialog.dismiss()))
    opened.on("pageerror", lambda error: opened.errors.append(str(error)))
    yield opened
    context.close()
    assert opened.errors == []


def shot(page: Any, tmp_path: Path, name: str) -> Path:
    """A full-page screenshot kept with the test, and in $HEMRA_ARTIFACTS when set."""
    path = tmp_path / f"viewer-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    artifacts = os.environ.get("HEMRA_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / path.name)
    return path


def cells(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("#grid a.cell", "cells => cells.map(c => c.title)"))


def test_runs_page_to_a_run_its_filtered_grid_and_a_trial(
    fixture: Fixture, viewer: str, page: Any, tmp_path: Path
) -> None:
    kept = {"network hemra-x": "containers not HEMRA's sit on it (web); disconnect them"}
    fixture.store.record_event(fixture.done, None, ENGINE_KEPT, {"stuck": kept})
    page.goto(viewer + "/")
    page.wait_for_selector(f'tr[data-run="{fixture.done}"]')
    assert page.text_content(f'tr[data-run="{fixture.done}"] .count-finished') == "12"
    said = page.text_content("#engine-kept li") or ""
    assert said == "the engine kept network hemra-x: containers not HEMRA's sit on it (web);" + (
        " disconnect them"
    )
    shot(page, tmp_path, "runs")

    page.click(f'tr[data-run="{fixture.done}"] a')
    page.wait_for_selector("#report table.report")
    page.wait_for_function("document.querySelectorAll('#grid a.cell').length === 12")
    assert page.text_content("#report table.report tbody tr td") == "base (baseline)"
    assert page.locator("#report svg circle").count() == 2
    assert "excluded from scores" in (page.text_content("#report .flags") or "")
    shot(page, tmp_path, "run")

    page.select_option("#grid select[name=harness]", "rival")
    page.wait_for_function("document.querySelectorAll('#grid a.cell').length === 6")
    assert all("[rival-" in title for title in cells(page))
    page.select_option("#grid select[name=outcome]", "fail")
    page.wait_for_function("document.querySelectorAll('#grid a.cell').length === 3")
    page.fill("#grid input[name=text]", "gamma")
    page.wait_for_function("document.querySelectorAll('#grid a.cell').length === 1")
    assert cells(page) == ["ds::gamma[rival-1]: fail reward 0"]
    assert page.text_content("#grid .matching") == "1 trial matches"
    assert "harness=rival" in page.url and "outcome=fail" in page.url
    shot(page, tmp_path, "run-filtered")

    page.click("#grid a.cell")
    page.wait_for_selector("#transcript .message")
    page.wait_for_selector("#calls-table")
    assert page.locator("#transcript .message").count() == 4
    assert "bash" in (page.text_content("#transcript .tool-call") or "")
    assert "Fixed the bug." in (page.text_content("#transcript") or "")
    assert "scripted-model-x" in (page.text_content("#calls-table") or "")
    assert "style" in (page.text_content("#rewards") or "")
    assert "verifier" in (page.text_content("#phases") or "")
    page.wait_for_selector('pre[data-file="diff.patch"] .add')
    assert page.text_content('pre[data-file="verifier/stdout.txt"]') == "1 passed\n"
    shot(page, tmp_path, "trial")


def test_a_running_run_updates_without_reloading(
    fixture: Fixture, viewer: str, page: Any, tmp_path: Path
) -> None:
    live = fixture.store.trials(fixture.live)
    page.goto(viewer + "/")
    row = f'tr[data-run="{fixture.live}"]'
    page.wait_for_selector(row)
    assert page.text_content(f"{row} .count-finished") == "0"
    page.evaluate("window.kept = 'still the same page'")
    fixture.store.finish_trial(live[0].id, trial_result(result("pass", 1.0, fixture.root)))
    page.wait_for_function(
        f"document.querySelector('{row} .count-finished').textContent === '1'", timeout=15_000
    )
    assert page.text_content(f"{row} .count-queued") == "11"
    assert page.evaluate("window.kept") == "still the same page"
    shot(page, tmp_path, "runs-live")

    page.goto(f"{viewer}/runs/{fixture.live}")
    page.wait_for_selector("#progress .count-finished")
    page.wait_for_function("document.querySelectorAll('#grid a.cell.o-pass').length === 1")
    page.evaluate("window.kept = 'still the same page'")
    fixture.store.finish_trial(live[1].id, trial_result(result("fail", 0.0, fixture.root)))
    page.wait_for_function(
        "document.querySelector('#progress .count-finished').textContent === '2'", timeout=15_000
    )
    page.wait_for_function("document.querySelectorAll('#grid a.cell.o-fail').length === 1")
    assert page.evaluate("window.kept") == "still the same page"
    shot(page, tmp_path, "run-live")


def test_the_runs_table_fits_a_1280_pixel_window_and_shows_an_interrupted_run(
    fixture: Fixture, viewer: str, browser: Any, tmp_path: Path
) -> None:
    store = fixture.store
    many = [f"a-harness-with-a-long-name-{n}" for n in range(12)]
    wide = {**spec(fixture.root / "datasets" / "ds"), "harnesses": {h: {} for h in many}}
    wide["spec"] = {**wide["spec"], "harnesses": many, "baseline": many[0]}
    store.record_plan("wide-run", "wide", wide, tmp_path, [])
    for trial in store.trials(fixture.live)[:3]:
        store.finish_trial(trial.id, trial_result(result("pass", 1.0, fixture.root)))
    store.interrupt_run(fixture.live)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        page.goto(viewer + "/")
        page.wait_for_selector('tr[data-run="wide-run"]')
        row = f'tr[data-run="{fixture.live}"]'
        assert page.text_content(f"{row} .status") == "interrupted (9 left)"
        assert page.text_content(f"{row} .done") == "12/12"
        shot(page, tmp_path, "runs-1280")
        right = page.evaluate("document.querySelector('#runs').getBoundingClientRect().right")
        widths = page.eval_on_selector_all("#runs th", "ths => ths.map(th => th.offsetWidth)")
        assert right <= 1280, f"the runs table ends at {right}px (columns {widths}), past 1280"
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    finally:
        context.close()


def test_agent_output_instruction_and_file_names_render_as_text(
    fixture: Fixture, viewer: str, page: Any, tmp_path: Path
) -> None:
    trial = fixture.store.trials(fixture.done)[0]  # alpha, base, attempt 1: the <script> output
    page.goto(f"{viewer}/trials/{trial.id}")
    page.wait_for_selector('pre[data-file="agent/stdout.txt"]')
    page.wait_for_function(
        "document.querySelector('pre[data-file=\"agent/stdout.txt\"]').textContent.length > 0"
    )
    assert page.text_content('pre[data-file="agent/stdout.txt"]').startswith(SCRIPT)
    assert page.is_visible(f'pre[data-file="agent/stdout.txt"] >> text={SCRIPT}')
    assert page.text_content("#instruction") == INSTRUCTION
    assert page.locator("#instruction *").count() == 0  # no element was made from the text
    assert page.locator("#files").get_by_text(ODD_FILE, exact=True).is_visible()
    shown = page.text_content('pre[data-file="agent/stdout.txt"]') or ""
    assert "\u241b[2Jcleared\u240dhidden" in shown and "\x1b" not in shown
    files = page.text_content("#files") or ""
    assert "esc\u241b[31mred\u240d.txt" in files and "\x1b" not in files
    page.wait_for_selector("#transcript .message.tool")
    assert SCRIPT in (page.text_content("#transcript .message.tool pre") or "")
    assert page.locator("main script, main img, main b:text('the')").count() == 0
    page.wait_for_timeout(500)  # anything that would fire has had its chance
    assert page.dialogs == []
    shot(page, tmp_path, "trial-escaped")


def test_a_matrix_run_shows_its_harness_by_model_grid_linking_to_each_cells_trials(
    tmp_path: Path, page: Any
) -> None:
    """Harness rows, model columns, each cell's mean reward and interval coloured by value; a
    cell links to the trial grid filtered to that cell's trials."""
    datasets = tmp_path / "datasets" / "ds"
    for task in TASKS:
        (datasets / task).mkdir(parents=True)
        (datasets / task / "instruction.md").write_text(task)
    store = Store(tmp_path / ".hemra" / "hemra.db")
    models = ["m/a", "m/b"]
    plan = [PlannedTrial("ds", t, h, 1, m) for t in TASKS for h in HARNESSES for m in models]
    recorded = spec(datasets)
    recorded["spec"] = {**recorded["spec"], "model": None, "models": models, "attempts": 1}
    trials_dir = tmp_path / ".hemra" / "runs" / "matrix"
    store.record_plan("matrix", "matrix run", recorded, trials_dir, plan)
    for trial in store.trials("matrix"):
        folder = trials_dir / "ds" / trial.task / f"{trial.harness}_{trial.model}-1"
        write_folder(folder, trial)
        passed = trial.harness == "base" or trial.model == "m/b"  # rival fails under m/a only
        done = result("pass" if passed else "fail", float(passed), folder)
        store.finish_trial(trial.id, trial_result(done))
    thread = ViewerThread(store.path, "127.0.0.1", 0)
    thread.start()
    try:
        page.goto(thread.url.rstrip("/") + "/runs/matrix")
        page.wait_for_selector("#report table.matrix")
        grid = page.eval_on_selector_all(
            "table.matrix tbody tr",
            "rows => rows.map(r => [...r.children].map(c => c.textContent))",
        )
        assert grid == [  # all or none of 3 tasks passed: Wilson's interval for 3 of 3, 0 of 3
            ["base", "1.000 [0.439, 1.000]", "1.000 [0.439, 1.000]"],
            ["rival", "0.000 [0.000, 0.561]", "1.000 [0.439, 1.000]"],
        ]
        colours = page.eval_on_selector_all(
            "table.matrix td.matrix-cell", "cells => cells.map(c => c.style.backgroundColor)"
        )
        assert colours[2] != colours[3] and all(colours)  # red for 0, green for 1
        assert page.locator("span", has_text="models m/a, m/b").count() == 1
        assert page.locator("#report h3", has_text="- model m/a").count() == 1
        assert page.locator("#report h3", has_text="- harness rival").count() == 1
        page.click("table.matrix tbody tr:nth-child(2) td:nth-child(2) a")
        page.wait_for_function("document.querySelectorAll('#grid a.cell').length === 3")
        assert all("[rival@m/a-1]" in title for title in cells(page))
        shot(page, tmp_path, "matrix")
    finally:
        thread.stop()
