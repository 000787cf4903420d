#!/bin/bash
# Verifier for edit-config.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

export PYTHONDONTWRITEBYTECODE=1
cd /tmp || exit 0
if timeout 20 python3 /tests/check_config.py; then
    echo "RESULT: all checks passed"
    echo 1 > /logs/verifier/reward.txt
else
    echo "RESULT: some checks failed"
fi
exit 0
