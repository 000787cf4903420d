#!/bin/bash
set -e
cd /app
# Bug 1: the values were never sorted.
sed -i 's/ordered = list(values)/ordered = sorted(values)/' mathutils.py
# Bug 2: for an even length the two middle values are mid-1 and mid.
sed -i 's/(ordered\[mid\] + ordered\[mid + 1\]) \/ 2/(ordered[mid - 1] + ordered[mid]) \/ 2/' mathutils.py
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest test_mathutils
