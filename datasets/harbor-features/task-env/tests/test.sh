#!/bin/bash
# [environment] env reaches the verifier too, and [verifier] env the verifier alone
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
expected="$FEATURE_GREETING $EXPECTED_WORD"
if [ -n "$FEATURE_GREETING" ] && [ "$(cat /app/out.txt 2>/dev/null)" = "$expected" ]; then
    echo "PASS: /app/out.txt is '$expected'"
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: expected '$expected', got '$(cat /app/out.txt 2>/dev/null)'"
fi
