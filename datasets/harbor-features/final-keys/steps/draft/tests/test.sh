#!/bin/bash
# the headline and an extra key: how many of the three words are there
mkdir -p /logs/verifier
found=0
for word in pear apple fig; do
    grep -qx "$word" /app/words.txt 2>/dev/null && found=$((found + 1))
done
reward=0
[ "$found" = 3 ] && reward=1
printf '{"reward": %s, "words": %s}\n' "$reward" "$found" > /logs/verifier/reward.json
