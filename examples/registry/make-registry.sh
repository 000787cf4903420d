#!/usr/bin/env bash
# Make a registry of one dataset whose tasks live in a git repository: two of the bundled
# hemra-offline tasks committed to OUT_DIR/tasks-repo, and OUT_DIR/registry.json pointing at that
# commit through a file:// URL.
#
#   examples/registry/make-registry.sh [OUT_DIR]     (default: examples/registry/build)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "${1:-$here/build}"
out="$(cd "${1:-$here/build}" && pwd)"
bundled="$here/../../datasets/hemra-offline"
if [ ! -d "$bundled" ]; then  # a copy `hemra init --example registry` wrote: the installed ones
  bundled="$("${PYTHON:-python3}" -c 'from pytest_hemra.resolve.datasets import bundled_dir
print(bundled_dir("datasets") / "hemra-offline")')"
fi
repo="$out/tasks-repo"

rm -rf "$repo"
mkdir -p "$repo/tasks"
for task in create-file fix-test; do
  cp -R "$bundled/$task" "$repo/tasks/$task"
done
find "$repo" -name __pycache__ -prune -exec rm -rf {} +

git -C "$repo" init --quiet
git -C "$repo" add --all
# a fixed author and date: the same files make the same commit id on every machine
GIT_AUTHOR_DATE="2025-01-01T00:00:00Z" GIT_COMMITTER_DATE="2025-01-01T00:00:00Z" \
  git -C "$repo" -c user.name="HEMRA example" -c user.email="example@hemra.invalid" \
  -c commit.gpgsign=false commit --quiet -m "two hemra-offline tasks"
commit="$(git -C "$repo" rev-parse HEAD)"

cat > "$out/registry.json" <<JSON
[
  {
    "name": "hemra-offline-mini",
    "version": "1.0",
    "description": "two bundled hemra-offline tasks, fetched from a git repository",
    "tasks": [
      {
        "name": "create-file",
        "git_url": "file://$repo",
        "git_commit_id": "$commit",
        "path": "tasks/create-file"
      },
      {
        "name": "fix-test",
        "git_url": "file://$repo",
        "git_commit_id": "$commit",
        "path": "tasks/fix-test"
      }
    ]
  }
]
JSON

echo "wrote $out/registry.json (hemra-offline-mini@1.0: $repo at $commit)"
echo "next: export HEMRA_REGISTRY=$out/registry.json"
