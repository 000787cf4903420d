#!/bin/bash
# Verifier for text-transform: compare /app/revenue_by_region.csv with the
# expected report (a missing final newline is tolerated).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

out=/app/revenue_by_region.csv
exp=/tests/expected.csv
pass=1

if [ ! -r "$out" ]; then
    echo "FAIL: $out does not exist or is not readable"
    exit 0
fi

norm=$(mktemp /tmp/verify.XXXXXX)
cat "$out" > "$norm"
if [ -s "$norm" ] && [ -n "$(tail -c 1 "$norm")" ]; then echo >> "$norm"; fi

if diff -u "$exp" "$norm"; then
    echo "PASS: $out matches the expected report"
else
    echo "FAIL: $out differs from the expected report (diff above: - expected, + actual)"
    pass=0
fi
rm -f "$norm"

if cmp -s /app/sales.csv /tests/sales.orig.csv; then
    echo "PASS: /app/sales.csv is unchanged"
else
    echo "FAIL: /app/sales.csv was modified or removed"
    pass=0
fi

[ "$pass" = 1 ] && echo 1 > /logs/verifier/reward.txt
exit 0
