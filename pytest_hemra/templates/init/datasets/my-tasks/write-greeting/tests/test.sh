#!/bin/bash
# Reward 1 when /app/greeting.txt holds one non-empty line, else 0.
if [ "$(grep -c . /app/greeting.txt 2>/dev/null)" = 1 ]; then echo 1; else echo 0; fi \
  > /logs/verifier/reward.txt
