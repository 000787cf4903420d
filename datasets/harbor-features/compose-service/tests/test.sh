#!/bin/bash
# the verifier keeps the trial network: it asks the service itself for the answer
mkdir -p /logs/verifier
exec 3<>/dev/tcp/api/8000 || { echo 0 > /logs/verifier/reward.txt; exit 0; }
printf 'GET /token HTTP/1.0\r\nHost: api\r\n\r\n' >&3
expected="$(sed '1,/^\r$/d' <&3)"
if [ -n "$expected" ] && [ "$(cat /app/token.txt 2>/dev/null)" = "$expected" ] && [ "$TOKEN_URL" = http://api:8000/token ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
