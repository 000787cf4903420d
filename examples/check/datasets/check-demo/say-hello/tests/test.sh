#!/bin/bash
if [ "$(cat /app/greeting.txt 2>/dev/null)" = hello ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "greeting.txt is missing or wrong" >&2; echo 0 > /logs/verifier/reward.txt
fi
