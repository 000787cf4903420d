"""Run ONE named check against textkit.py in the current directory.

Usage: python3 checks.py <check-name>; exit status 0 means the check passed.
"""
import sys


def check_count_vowels(tk):
    assert tk.count_vowels("") == 0
    assert tk.count_vowels("hello world") == 3
    assert tk.count_vowels("AEIOU aeiou") == 10
    assert tk.count_vowels("rhythm") == 0


def check_reverse_words(tk):
    assert tk.reverse_words("hello world") == "world hello"
    assert tk.reverse_words("  the quick\tfox ") == "fox quick the"
    assert tk.reverse_words("single") == "single"
    assert tk.reverse_words("") == ""
    assert tk.reverse_words("a\n b  c") == "c b a"


def check_is_palindrome(tk):
    assert tk.is_palindrome("A man, a plan, a canal: Panama") is True
    assert tk.is_palindrome("racecar") is True
    assert tk.is_palindrome("No 'x' in Nixon") is True
    assert tk.is_palindrome("") is True
    assert tk.is_palindrome("abc") is False
    assert tk.is_palindrome("12321") is True
    assert tk.is_palindrome("123 421") is False


def check_fizzbuzz(tk):
    assert tk.fizzbuzz(0) == []
    assert tk.fizzbuzz(5) == ["1", "2", "Fizz", "4", "Buzz"]
    out = tk.fizzbuzz(30)
    assert len(out) == 30
    assert out[14] == "FizzBuzz" and out[29] == "FizzBuzz"
    assert out[8] == "Fizz" and out[9] == "Buzz" and out[10] == "11"


CHECKS = {
    "count_vowels": check_count_vowels,
    "reverse_words": check_reverse_words,
    "is_palindrome": check_is_palindrome,
    "fizzbuzz": check_fizzbuzz,
}

if __name__ == "__main__":
    name = sys.argv[1]
    sys.path.insert(0, ".")
    try:
        import textkit
        CHECKS[name](textkit)
    except BaseException as exc:
        print(f"  {name}: {type(exc).__name__}: {exc}")
        sys.exit(1)
    sys.exit(0)
