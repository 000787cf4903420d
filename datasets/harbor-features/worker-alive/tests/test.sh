#!/bin/bash
# the worker the agent left running answers
echo 0 > /logs/verifier/reward.txt
if exec 3<>/dev/tcp/127.0.0.1/8765 2>/dev/null; then
    echo ping >&3
    read -r -t 5 answer <&3
    if [ "$answer" = pong ]; then
        echo PASS
        echo 1 > /logs/verifier/reward.txt
        exit 0
    fi
fi
echo "FAIL: nothing answers on 127.0.0.1:8765"
