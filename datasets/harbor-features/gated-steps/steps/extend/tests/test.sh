#!/bin/bash
mkdir -p /logs/verifier
if [ "$(sed -n 2p /app/counter.txt)" = 3 ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
