#!/bin/bash
mkdir -p /logs/verifier
# what BuildKit built (a mode from COPY --chmod; a build mount gone from the image) and the answer
if [ "$(stat -c %a /usr/local/bin/shout)" = 755 ] && [ ! -e /mnt/greeting.txt ] \
    && [ "$(cat /app/out.txt 2>/dev/null)" = "HELLO FROM BUILDKIT" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
