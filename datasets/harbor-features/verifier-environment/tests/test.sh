#!/bin/bash
# runs in the verifier's own room: its image (tests/Dockerfile), its env, the agent's /app
echo 0 > /logs/verifier/reward.txt
if [ "$(cat /etc/verifier-marker 2>/dev/null)" != "verifier image" ]; then
    echo "FAIL: not the verifier's own image"
elif [ "$VERIFIER_FLAVOUR" != own ]; then
    echo "FAIL: VERIFIER_FLAVOUR is '$VERIFIER_FLAVOUR'"
elif [ "$(cat /app/answer.txt 2>/dev/null)" = checked ]; then
    echo PASS
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: answer '$(cat /app/answer.txt 2>/dev/null)'"
fi
