#!/bin/bash
# Verifier for partial-credit: 4 independent checks, one per function in
# /app/textkit.py. Writes /logs/verifier/reward.json.
mkdir -p /logs/verifier
total=4
passed=0
write_reward() {
    reward=$(awk -v p="$passed" -v t="$total" 'BEGIN { printf "%g", p / t }')
    printf '{"reward": %s, "checks_passed": %d, "checks_total": %d}\n' \
        "$reward" "$passed" "$total" > /logs/verifier/reward.json
}
write_reward   # always leave a reward file behind, even if we die early

work=$(mktemp -d /tmp/verify.XXXXXX)
if [ -r /app/textkit.py ]; then
    cp /app/textkit.py "$work/textkit.py"
else
    echo "FAIL: /app/textkit.py is missing"
fi
export PYTHONDONTWRITEBYTECODE=1

for check in count_vowels reverse_words is_palindrome fizzbuzz; do
    if (cd "$work" && timeout 5 python3 /tests/checks.py "$check"); then
        echo "PASS: $check"
        passed=$((passed + 1))
    else
        echo "FAIL: $check"
    fi
done
rm -rf "$work"

write_reward
echo "checks passed: $passed/$total"
cat /logs/verifier/reward.json
exit 0
