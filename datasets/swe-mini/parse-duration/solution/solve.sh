#!/bin/bash
set -e
cd /app
cat > duration.py <<'PY'
import re


def parse_duration(text):
    """Seconds in a duration like "2h", "45m", "1h30m" or "1h30m15s"."""
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(number) * units[unit] for number, unit in re.findall(r"(\d+)([hms])", text))
PY
