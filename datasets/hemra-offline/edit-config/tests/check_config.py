"""Checks for the edit-config task. Exit status 0 means every check passed."""
import configparser
import sys

TARGET = "/app/server.ini"
ORIGINAL = "/tests/original.ini"

ok = True


def check(cond, msg):
    global ok
    print(("PASS: " if cond else "FAIL: ") + msg)
    if not cond:
        ok = False


try:
    with open(TARGET, encoding="utf-8") as fh:
        text = fh.read()
except OSError as exc:
    print(f"FAIL: cannot read {TARGET}: {exc}")
    sys.exit(1)

cfg = configparser.ConfigParser(interpolation=None)  # strict: rejects duplicates
try:
    cfg.read_string(text)
except configparser.Error as exc:
    print(f"FAIL: {TARGET} is not valid INI (or has duplicates): {exc}")
    sys.exit(1)


def get(section, key):
    return cfg.get(section, key, fallback=None)


check(get("server", "port") == "9090", "[server] port = 9090")
check(get("features", "cache") == "true", "[features] cache = true")
check(get("server", "timeout") == "30", "[server] timeout = 30")
check(get("metrics", "port") == "9100", "[metrics] port still 9100")

# Every original line, except the two that had to change, must still be
# present, unmodified and in the same relative order.
with open(ORIGINAL, encoding="utf-8") as fh:
    original = fh.read().splitlines()
changed = {("[server]", "port = 8080"), ("[features]", "cache = false")}
expected = []
section = None
for line in original:
    if line.startswith("["):
        section = line
    if (section, line) in changed:
        continue
    expected.append(line.rstrip())

actual = [line.rstrip() for line in text.splitlines()]
pos = 0
missing = []
for line in expected:
    try:
        pos = actual.index(line, pos) + 1
    except ValueError:
        missing.append(line)
check(not missing, "all other original lines kept, in order"
      + ("" if not missing else f" (missing/moved: {missing!r})"))

# Nothing besides the new timeout line should have been added.
extra = len([l for l in actual if l.strip()]) - len([l for l in expected if l.strip()])
check(extra == 3, f"exactly 3 non-blank lines differ from the kept ones (got {extra})")

sys.exit(0 if ok else 1)
