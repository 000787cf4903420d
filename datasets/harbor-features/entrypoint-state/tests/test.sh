#!/bin/bash
# the token is the one this sandbox's entrypoint wrote; the agent ran as the image's USER (1234)
mkdir -p /logs/verifier
if [ "$(head -1 /app/answer.txt 2>/dev/null)" = "$(cat /srv/state/token)" ] \
    && [ "$(sed -n 2p /app/answer.txt)" = 1234 ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
