#!/bin/bash
set -e
cd /app
for f in geometry.py report.py inventory.py main.py; do
    sed -i 's/\bcalc_area\b/compute_area/g' "$f"
done
PYTHONDONTWRITEBYTECODE=1 python3 main.py
