#!/bin/bash
# bash's /dev/tcp as an HTTP client: the sandbox needs no curl
set -euo pipefail
exec 3<>/dev/tcp/api/8000
printf 'GET /token HTTP/1.0\r\nHost: api\r\n\r\n' >&3
sed '1,/^\r$/d' <&3 > /app/token.txt
