#!/usr/bin/env bash
# A Docker restart in the middle of a run, as an operator meets it (docs/runs.md, "Faults").
#
#   examples/restart-drill/drill.sh      # restarts this machine's Docker: run it where you may
#   RESTART="ssh box2 sudo systemctl restart docker" DOCKER_HOST=tcp://box2:2376 \
#     examples/restart-drill/drill.sh    # or another engine, restarted your way
#
# It starts run.toml in the background, restarts the engine 15 s in (RESTART, by default
# `sudo systemctl restart docker`), prints `hemra runs` every second meanwhile (the run shows
# `waiting for engine ...` while the engine is down), then how the run ended: every trial
# finished in this one run, the lost ones rerun without using up a retry. `hemra show TRIAL`
# on a rerun trial tells its engine_outage apart from a fault of its own. Last, `hemra clean`
# lists, then removes, what the run left on the engine that no live trial owns (a restart also
# clears the run networks Docker sometimes cannot remove under load).
set -euo pipefail
cd "$(dirname "$0")"
export HEMRA_BACKOFF_MAX_SECS="${HEMRA_BACKOFF_MAX_SECS:-5}"  # ask a lost engine every <= 5 s
store=.hemra/hemra.db
log=.hemra/drill.log
mkdir -p .hemra
hemra run run.toml --store "$store" > "$log" 2>&1 &
runner=$!
sleep 15
${RESTART:-sudo systemctl restart docker} &
while kill -0 "$runner" 2> /dev/null; do
  hemra runs --store "$store" | tail -n 1
  sleep 1
done
if wait "$runner"; then echo "the run finished: every trial has a result"; else
  echo "the run exited $?: see examples/restart-drill/$log"; fi
tail -n 3 "$log"
hemra clean --store "$store" --dry-run
hemra clean --store "$store"
