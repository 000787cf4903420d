"""The runner's memory for a big change to /app: the diff of a 128 MiB tree (the cap of a tree's
read, `MAX_TREE_BYTES`), as the trial writes it to `diff.patch`.

Each measure runs in a process of its own and prints its peak RSS (`ru_maxrss`) above the same
process holding the two trees alone: what the diff itself costs. Shapes: `added` (128 new files
of 1 MiB each, short lines) and `changed` (the same files in the image, every line changed).
Methods: `write_diff` (streamed to its file, one changed file at a time, up to its cap) and the
former `tree_diff` (the whole diff built as text, then cut to the cap), kept here to compare.

    python benchmarks/big_diff.py [--mib 128]
"""

from __future__ import annotations

import argparse
import difflib
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_hemra.execute.diff import MAX_DIFF_BYTES, write_diff  # noqa: E402

FILE_BYTES = 1 << 20
LINE = b"a line of the agent's text, about forty bytes\n"


def trees(shape: str, mib: int) -> tuple[dict[str, bytes], dict[str, bytes]]:
    lines = FILE_BYTES // len(LINE)
    after = {f"dir{i % 8}/file{i:04d}.txt": (LINE * lines) for i in range(mib)}
    if shape == "added":
        return {}, after
    before = {name: LINE.replace(b"a line", b"A LINE") * lines for name in after}
    return before, after


def former_tree_diff(before: dict[str, bytes], after: dict[str, bytes]) -> str:
    """`execute/diff.py`'s tree_diff before it was streamed (commit 0d1aa33)."""
    lines: list[str] = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        try:
            old_text = (old or b"").decode().splitlines(keepends=True)
            new_text = (new or b"").decode().splitlines(keepends=True)
        except UnicodeDecodeError:
            lines.append(f"Binary files a/{name} and b/{name} differ\n")
            continue
        lines.extend(
            difflib.unified_diff(
                old_text,
                new_text,
                fromfile=f"a/{name}" if old is not None else "/dev/null",
                tofile=f"b/{name}" if new is not None else "/dev/null",
            )
        )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text[:MAX_DIFF_BYTES]


def measure(method: str, shape: str, mib: int) -> None:
    """In this process: the peak RSS (MB) of the trees alone, then with the diff made."""
    before, after = trees(shape, mib)
    held = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "diff.patch"
        if method == "write_diff":
            write_diff(before, after, path)
        elif method == "tree_diff (former)":
            path.write_text(former_tree_diff(before, after))
        size = path.stat().st_size if path.exists() else 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{held:.0f} {peak:.0f} {size}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure[0], args.measure[1], args.mib)
        return
    print(f"diff of a {args.mib} MiB tree: peak RSS above the trees held (MB), diff.patch bytes")
    for shape in ("added", "changed"):
        for method in ("write_diff", "tree_diff (former)"):
            out = subprocess.run(
                [sys.executable, __file__, "--mib", str(args.mib), "--measure", method, shape],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            held, peak, size = float(out[0]), float(out[1]), int(out[2])
            print(f"  {shape:8} {method:20} +{peak - held:6.0f} MB  (trees {held:.0f} MB)  {size}")


if __name__ == "__main__":
    main()
