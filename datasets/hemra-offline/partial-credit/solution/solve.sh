#!/bin/bash
set -e
cd /app
cat > textkit.py <<'PY'
"""A tiny collection of string helpers."""

VOWELS = set("aeiouAEIOU")


def count_vowels(s):
    """Return the number of vowels (a, e, i, o, u; either case) in s."""
    return sum(1 for ch in s if ch in VOWELS)


def reverse_words(s):
    """Return the whitespace-separated words of s in reverse order,
    joined by single spaces."""
    return " ".join(reversed(s.split()))


def is_palindrome(s):
    """Return True if s is a palindrome, considering only letters and
    digits and ignoring case."""
    cleaned = [ch.lower() for ch in s if ch.isalnum()]
    return cleaned == cleaned[::-1]


def fizzbuzz(n):
    """Return the FizzBuzz strings for 1..n."""
    out = []
    for i in range(1, n + 1):
        if i % 15 == 0:
            out.append("FizzBuzz")
        elif i % 3 == 0:
            out.append("Fizz")
        elif i % 5 == 0:
            out.append("Buzz")
        else:
            out.append(str(i))
    return out
PY
