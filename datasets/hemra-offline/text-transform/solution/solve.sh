#!/bin/bash
set -e
cd /app
{
    echo "region,revenue"
    awk -F, 'NR > 1 && $6 == "shipped" { rev[$2] += $4 * $5 }
             END { for (r in rev) printf "%s,%.2f\n", r, rev[r] }' sales.csv |
        sort -t, -k2,2 -g -r
} > revenue_by_region.csv
