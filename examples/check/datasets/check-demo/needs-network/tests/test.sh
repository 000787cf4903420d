#!/bin/bash
# Looks up the Debian mirror before testing (as a verifier that installs a test tool would):
# without a network the lookup fails, in 2 s rather than glibc's default 20.
if ! RES_OPTIONS='timeout:1 attempts:1' getent hosts deb.debian.org > /dev/null; then
  echo "getent: deb.debian.org: Temporary failure in name resolution" >&2
  exit 1
fi
if [ "$(cat /app/greeting.txt 2>/dev/null)" = hello ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
