#!/bin/bash
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "hello from hemra" ]; then
  echo "greeting is right"; echo 1 > /logs/verifier/reward.txt
else
  echo "greeting is missing or wrong"; echo 0 > /logs/verifier/reward.txt
fi
