#!/bin/bash
# Verifier for fix-test: run the PRISTINE unit tests against the agent's
# mathutils.py, in a scratch copy so that /app is never modified.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

if [ ! -f /app/mathutils.py ]; then
    echo "FAIL: /app/mathutils.py is missing"
    exit 0
fi

work=$(mktemp -d /tmp/verify.XXXXXX)
cp /app/*.py "$work"/ 2>/dev/null
cp /tests/test_mathutils.py "$work"/test_mathutils.py   # pristine copy wins
cd "$work" || exit 0

export PYTHONDONTWRITEBYTECODE=1
if timeout 20 python3 -m unittest -v test_mathutils; then
    echo "PASS: all tests in test_mathutils.py pass"
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: unittest reported failures"
fi
rm -rf "$work"
exit 0
