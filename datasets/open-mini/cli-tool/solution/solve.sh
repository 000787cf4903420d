#!/bin/bash
set -e
cd /app
cat > wc.py <<'PY'
"""wc.py: line, word and character counts of a file, like wc."""

import argparse
import sys


def counts(text):
    return len(text.splitlines()), len(text.split()), len(text)


def main():
    parser = argparse.ArgumentParser(description="Print line, word and character counts.")
    parser.add_argument("file")
    args = parser.parse_args()
    try:
        with open(args.file, encoding="utf-8") as handle:
            lines, words, chars = counts(handle.read())
    except OSError as error:
        print(f"wc.py: {error}", file=sys.stderr)
        return 1
    print(f"{lines} {words} {chars} {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
cat > README.md <<'MD'
# wc.py

Counts lines, words and characters of a file: `python3 wc.py notes.txt` prints
`3 12 64 notes.txt`. `python3 wc.py --help` shows the options.
MD
