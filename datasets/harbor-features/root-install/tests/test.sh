#!/bin/bash
mkdir -p /logs/verifier
if dpkg -s hello-hemra >/dev/null 2>&1 && [ "$(cat /app/hello.txt 2>/dev/null)" = "hello from a package" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
