#!/bin/bash
set -e
cat > /app/greet.py <<'PY'
def greet(name):
    return f"Hello, {name.strip()}"
PY
