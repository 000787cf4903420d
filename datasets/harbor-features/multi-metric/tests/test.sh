#!/bin/bash
# two metrics, no `reward` key: correctness (the right number) and performance (within 1 s)
mkdir -p /logs/verifier
correctness=0
performance=0
if [ -x /app/fib.sh ]; then
    started=$(date +%s%N)
    output=$(timeout 5 /app/fib.sh 2>/dev/null)
    elapsed=$(( ($(date +%s%N) - started) / 1000000 ))
    [ "$output" = 75025 ] && correctness=1
    [ "$elapsed" -lt 1000 ] && performance=1
    echo "fib.sh printed '$output' in ${elapsed} ms"
else
    echo "FAIL: no executable /app/fib.sh"
fi
printf '{"correctness": %s, "performance": %s}\n' "$correctness" "$performance" \
    > /logs/verifier/reward.json
