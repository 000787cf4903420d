#!/bin/bash
# Verifier for create-file: /app/hello.txt must be exactly "hello, world"
# with at most one trailing newline.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

f=/app/hello.txt
if [ ! -f "$f" ]; then
    echo "FAIL: $f does not exist"
    exit 0
fi
if [ ! -r "$f" ]; then
    echo "FAIL: $f is not readable"
    exit 0
fi
if cmp -s "$f" <(printf 'hello, world') || cmp -s "$f" <(printf 'hello, world\n'); then
    echo "PASS: $f contains exactly 'hello, world'"
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: unexpected content in $f:"
    od -c "$f" | head -n 5
fi
exit 0
