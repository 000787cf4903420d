#!/bin/bash
set -e
cd /app
tr -d '\r' < notes.txt | tr '\t' ' ' | tr -s ' ' |
    sed -e 's/^ //' -e 's/ $//' | { grep -v '^$' || true; } > notes_clean.txt
