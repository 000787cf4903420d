#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/report/summary.txt 2>/dev/null)" = done ] && grep -q true /app/summary.json 2>/dev/null; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
