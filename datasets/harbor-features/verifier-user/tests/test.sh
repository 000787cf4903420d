#!/bin/bash
# Harbor runs the verifier as the image's USER (no [verifier] user here): dev, who owns /app.
# Tools that refuse a folder someone else owns (git's safe.directory) would fail as root.
echo 0 > /logs/verifier/reward.txt
if [ "$(id -un)" != dev ] || [ "$(stat -c %u /app)" != "$(id -u)" ]; then
    echo "FAIL: the verifier is $(id -un) (uid $(id -u)); /app belongs to uid $(stat -c %u /app)"
elif [ "$(cat /app/notes.txt)" = final ] && [ "$HOME" = /home/dev ]; then
    echo PASS
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: notes '$(cat /app/notes.txt)', HOME $HOME"
fi
