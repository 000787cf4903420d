#!/bin/bash
set -e
cd /app
export LC_ALL=C
awk '$2 == "ERROR"' app.log > errors.log
{
    awk '{ sub(/:$/, "", $3); print $3 }' errors.log | sort | uniq -c |
        sort -k1,1nr -k2,2 | awk '{ print $2, $1 }'
    echo "total $(wc -l < errors.log)"
} > error_summary.txt
