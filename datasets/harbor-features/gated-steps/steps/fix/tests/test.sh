#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/counter.txt)" = 2 ] && [ "$(stat -c %U /app/.setup-ran)" = root ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
