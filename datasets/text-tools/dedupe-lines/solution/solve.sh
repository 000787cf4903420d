#!/bin/bash
set -e
cd /app
awk 'length($0) > 0 && !seen[tolower($0)]++' subscribers.txt > unique.txt
