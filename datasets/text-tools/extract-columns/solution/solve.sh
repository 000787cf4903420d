#!/bin/bash
set -e
cd /app
export LC_ALL=C
awk -F: '$3 >= 1000 && $3 <= 59999 { print $1 "," $7 }' passwd.txt | sort > users.csv
