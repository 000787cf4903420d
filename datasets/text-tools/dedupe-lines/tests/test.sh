#!/bin/bash
# Verifier for dedupe-lines: output files must match the expected ones byte for
# byte, and the input files must be unchanged.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
pass=1

compare() { # actual expected
    if [ ! -r "$1" ]; then
        echo "FAIL: $1 does not exist or is not readable"; pass=0; return
    fi
    if cmp -s "$1" "$2"; then
        echo "PASS: $1 matches the expected output"
    else
        echo "FAIL: $1 differs from the expected output (- expected, + actual):"
        diff -u "$2" "$1" | head -n 40
        if [ -s "$1" ] && [ -n "$(tail -c 1 "$1")" ]; then
            echo "      (note: the last line of $1 does not end with a newline)"
        fi
        pass=0
    fi
}
unchanged() { # input pristine-copy
    if cmp -s "$1" "$2"; then
        echo "PASS: $1 is unchanged"
    else
        echo "FAIL: $1 was modified or removed"; pass=0
    fi
}

compare /app/unique.txt /tests/expected.txt
unchanged /app/subscribers.txt /tests/orig.subscribers.txt

if [ "$pass" = 1 ]; then
    echo "RESULT: all checks passed"
    echo 1 > /logs/verifier/reward.txt
else
    echo "RESULT: some checks failed"
fi
exit 0
