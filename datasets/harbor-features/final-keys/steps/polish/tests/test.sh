#!/bin/bash
# the last step's keys are the trial's (the strategy is "final"): its headline and `sorted`
mkdir -p /logs/verifier
reward=0
sorted=0
if [ "$(cat /app/words.txt 2>/dev/null)" = "$(printf 'apple\nfig\npear')" ]; then
    reward=1
    sorted=1
fi
printf '{"reward": %s, "sorted": %s}\n' "$reward" "$sorted" > /logs/verifier/reward.json
