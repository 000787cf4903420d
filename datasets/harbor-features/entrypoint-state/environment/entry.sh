#!/bin/sh
# the image's entrypoint leaves state the agent must use, then runs what it is handed
echo "token-$$-$(date +%s%N)" > /srv/state/token
exec "$@"
