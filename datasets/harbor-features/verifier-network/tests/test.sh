#!/bin/bash
# this verifier needs its network: it has an interface besides lo
mkdir -p /logs/verifier
if [ -f /app/done.txt ] && ls /sys/class/net | grep -qv '^lo$'; then
    echo 1 > /logs/verifier/reward.txt
else
    echo "done.txt: $(ls /app/done.txt 2>&1); interfaces: $(ls /sys/class/net | tr '\n' ' ')"
    echo 0 > /logs/verifier/reward.txt
fi
