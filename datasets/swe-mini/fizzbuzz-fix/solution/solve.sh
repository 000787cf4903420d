#!/bin/bash
set -e
cd /app
cat > fizz.py <<'PY'
def fizzbuzz(n):
    """Return "Fizz" for multiples of 3, "Buzz" for multiples of 5, "FizzBuzz" for both."""
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)
PY
