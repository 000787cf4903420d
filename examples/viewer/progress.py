"""Script the viewer's JSON API: every run's progress, then one run's trials of an outcome, each
with the first line of its agent's output. Standard library only.

    hemra view &                                         # or `hemra serve`, which also works it
    python examples/viewer/progress.py                    # the viewer at http://127.0.0.1:8765
    python examples/viewer/progress.py --run RUN_ID --outcome harness_error --harness codex
    python examples/viewer/progress.py --url http://HOST:8765 --token TOKEN   # beyond loopback

The token may also come from HEMRA_VIEWER_TOKEN. See docs/viewer.md for every endpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def get(base: str, token: str | None, path: str, **query: Any) -> Any:
    """GET an API path; the query's None values are left out."""
    params = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
    request = urllib.request.Request(f"{base}{path}" + (f"?{params}" if params else ""))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        sys.exit(f"{path}: HTTP {error.code}: {json.load(error).get('error')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765")
    parser.add_argument("--token", default=os.environ.get("HEMRA_VIEWER_TOKEN"))
    parser.add_argument("--run", help="run id (default: the newest run)")
    parser.add_argument("--outcome", default="fail", help="pass, fail, infra_error, running, ...")
    parser.add_argument("--harness", help="only this harness's trials")
    args = parser.parse_args()
    base = args.url.rstrip("/")

    runs = get(base, args.token, "/api/runs")["runs"]  # newest first
    for run in runs:
        p = run["progress"]
        print(
            f"{run['id']}  {run['name']:<20} {run['status']:<10}"
            f" {p['finished'] + p['cancelled']}/{p['total']} done, {p['running']} running,"
            f" {p['queued']} queued  {', '.join(run['harnesses'])}"
        )
    run_id = args.run or (runs[0]["id"] if runs else None)
    if run_id is None:
        return

    print(f"\n{run_id}: {args.outcome} trials" + (f" of {args.harness}" if args.harness else ""))
    cursor, shown = None, 0
    while True:  # a cursor walks every page, even while trials are added
        page = get(
            base, args.token, f"/api/runs/{urllib.parse.quote(run_id)}/trials",
            outcome=args.outcome, harness=args.harness, limit=100, cursor=cursor,
        )  # fmt: skip
        for trial in page["trials"]:
            quoted = urllib.parse.quote(trial["id"])
            listed = get(base, args.token, f"/api/trials/{quoted}/files")["files"]
            files = {f["path"] for f in listed}
            first_line = ""
            if "agent/stdout.txt" in files:
                chunk = get(
                    base, args.token, f"/api/trials/{quoted}/files/agent/stdout.txt", limit=200
                )
                first_line = (chunk["text"] or "").splitlines()[0] if chunk["text"] else ""
            print(f"  {trial['item_id']:<50} reward {trial['reward']}  {first_line[:60]!r}")
            shown += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    print(f"{shown} of {page['total']} matching trials")


if __name__ == "__main__":
    main()
