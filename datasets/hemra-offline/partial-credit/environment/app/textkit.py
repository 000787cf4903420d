"""A tiny collection of string helpers."""

VOWELS = set("aeiouAEIOU")


def count_vowels(s):
    """Return the number of vowels (a, e, i, o, u; either case) in s."""
    return sum(1 for ch in s if ch in VOWELS)


def reverse_words(s):
    """Return the whitespace-separated words of s in reverse order,
    joined by single spaces."""
    raise NotImplementedError


def is_palindrome(s):
    """Return True if s is a palindrome, considering only letters and
    digits and ignoring case."""
    raise NotImplementedError


def fizzbuzz(n):
    """Return the FizzBuzz strings for 1..n."""
    raise NotImplementedError
