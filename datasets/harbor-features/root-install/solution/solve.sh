#!/bin/bash
# installing a package needs root: the agent runs as the task's user (the image's: root)
set -e
dpkg -i /opt/hello-hemra.deb
hello-hemra > /app/hello.txt
