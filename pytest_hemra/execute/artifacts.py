"""A task's declared artifacts (`artifacts`, a step's), copied out of the sandbox into the trial
folder's `artifacts/` after the agent (and after each step's verifier), with `manifest.json`
saying what each entry gave. Files are read bounded, as `read_tree` reads them; the agent may
have written anything there, so names are kept inside the folder and nothing is executed.
`/logs/artifacts` (Harbor's convention) is collected too when it holds anything."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

from pytest_hemra.execute.output import FolderBudget
from pytest_hemra.execute.sandbox import Sandbox
from pytest_hemra.resolve.taskconfig import TaskArtifact

CONVENTION = "/logs/artifacts"
MANIFEST = "manifest.json"


def collect(
    sandbox: Sandbox,
    entries: list[str | TaskArtifact],
    target: Path,
    budget: FolderBudget | None = None,
) -> list[dict[str, Any]]:
    """Copy every entry into `target` (its `destination`, else its source path below `target`)
    as far as the trial folder's `budget` goes; returns and writes the manifest: source,
    destination, files copied, skipped, left out for the budget (`over_cap`), missing."""
    manifest: list[dict[str, Any]] = []
    for entry in [CONVENTION, *entries]:
        artifact = TaskArtifact(source=entry) if isinstance(entry, str) else entry
        source = artifact.source.rstrip("/") or "/"
        destination = artifact.destination or source.lstrip("/")
        tree = sandbox.read_tree(source)
        files = {
            name: content
            for name, content in tree.items()
            if name not in tree.skipped  # over the cap: named in the manifest, never copied
            and not any(fnmatch.fnmatch(name, pattern) for pattern in artifact.exclude)
        }
        if entry == CONVENTION and not files:
            continue
        base = (target / destination).resolve()
        written = over_cap = 0
        for name, content in files.items():
            path = base if tree.is_file else base / name
            if target.resolve() not in path.parents:  # names come from the sandbox: stay inside
                continue
            where = str(path.relative_to(target.resolve().parent))
            if budget is not None and not budget.take(where, len(content)):
                over_cap += 1
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            written += 1
        manifest.append(
            {
                "source": source,
                "destination": destination,
                "files": written,
                "skipped": tree.noted_skips(),  # the first 1,000 (the agent's names)
                "skipped_files": len(tree.skipped),
                "stopped": tree.stopped,
                "over_cap": over_cap,
                "missing": not tree and not tree.skipped,
            }
        )
    if manifest:
        target.mkdir(parents=True, exist_ok=True)
        (target / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest
