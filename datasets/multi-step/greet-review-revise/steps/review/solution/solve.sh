#!/bin/bash
set -e
printf '%s\n' '- greet() should ignore spaces around the name.' > /app/REVIEW.md
