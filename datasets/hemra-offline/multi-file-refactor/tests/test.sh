#!/bin/bash
# Verifier for multi-file-refactor: calc_area -> compute_area everywhere,
# same program output.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
pass=1
fail() { echo "FAIL: $*"; pass=0; }

for f in geometry.py report.py inventory.py main.py; do
    [ -r "/app/$f" ] || fail "/app/$f is missing"
done

hits=$(grep -rn --include='*.py' 'calc_area' /app 2>/dev/null)
if [ -n "$hits" ]; then
    fail "old name 'calc_area' still present:"
    echo "$hits"
else
    echo "PASS: no 'calc_area' left in any .py file under /app"
fi

if grep -Eq '^def compute_area\(' /app/geometry.py 2>/dev/null; then
    echo "PASS: geometry.py defines compute_area"
else
    fail "geometry.py does not define compute_area at top level"
fi

for f in report.py inventory.py main.py; do
    if grep -q 'compute_area' "/app/$f" 2>/dev/null; then
        echo "PASS: $f uses compute_area"
    else
        fail "$f does not use compute_area"
    fi
done

# Run the program from a scratch copy so /app is not modified.
work=$(mktemp -d /tmp/verify.XXXXXX)
cp /app/*.py "$work"/ 2>/dev/null
export PYTHONDONTWRITEBYTECODE=1
if (cd "$work" && timeout 20 python3 main.py) > "$work/.out" 2> "$work/.err"; then
    if diff -u /tests/expected_output.txt "$work/.out"; then
        echo "PASS: python3 main.py prints the original output"
    else
        fail "python3 main.py output changed (diff above: - expected, + actual)"
    fi
else
    fail "python3 main.py failed:"
    cat "$work/.err"
fi

if [ "$pass" = 1 ]; then
    (cd "$work" && timeout 10 python3 -c 'import geometry, sys; sys.exit(0 if callable(getattr(geometry, "compute_area", None)) and not hasattr(geometry, "calc_area") else 1)') \
        && echo "PASS: geometry.compute_area is callable, geometry.calc_area is gone" \
        || fail "geometry module does not expose compute_area (or still has calc_area)"
fi
rm -rf "$work"

[ "$pass" = 1 ] && echo 1 > /logs/verifier/reward.txt
exit 0
