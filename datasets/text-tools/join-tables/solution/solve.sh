#!/bin/bash
set -e
cd /app
export LC_ALL=C
tmp=$(mktemp -d)
# employees keyed by dept_id: dept_id,name ; departments: dept_id,dept_name
tail -n +2 employees.csv | awk -F, '{ print $3 "," $2 }' | sort -t, -k1,1 > "$tmp/emp"
tail -n +2 departments.csv | sort -t, -k1,1 > "$tmp/dept"
{
    echo "name,dept_name"
    join -t, -a 1 -e UNKNOWN -o 1.2,2.2 "$tmp/emp" "$tmp/dept" | sort -t, -k1,1
} > employee_departments.csv
