#!/bin/bash
set -e
cd /app
cat > slug.py <<'PY'
import re


def slugify(title):
    """A URL slug: lowercase words of letters and digits joined by single hyphens."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
PY
