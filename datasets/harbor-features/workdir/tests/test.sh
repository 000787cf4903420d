#!/bin/bash
# the verifier runs in the workdir as well
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
if [ "$(pwd)" = /workspace ] && [ "$(cat where.txt 2>/dev/null)" = /workspace ] \
    && [ "$(cat notes.txt)" = final ]; then
    echo PASS
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: pwd $(pwd), where.txt '$(cat where.txt 2>/dev/null)', notes '$(cat notes.txt)'"
fi
