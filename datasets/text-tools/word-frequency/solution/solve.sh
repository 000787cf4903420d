#!/bin/bash
set -e
cd /app
export LC_ALL=C
tr 'A-Z' 'a-z' < text.txt |
    tr -cs 'a-z' '\n' |
    grep -v '^$' |
    sort | uniq -c |
    sort -k1,1nr -k2,2 |
    head -n 10 |
    awk '{ print $1, $2 }' > top_words.txt
