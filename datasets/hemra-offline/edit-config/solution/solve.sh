#!/bin/bash
set -e
cd /app
# Section-aware edits with awk: track the current [section].
awk '
    /^\[.*\]$/ { section = $0 }
    section == "[server]"   && $1 == "port"  { print "port = 9090"; next }
    section == "[server]"   && $1 == "workers" { print; print "timeout = 30"; next }
    section == "[features]" && $1 == "cache" { print "cache = true"; next }
    { print }
' server.ini > /tmp/server.ini.new
cat /tmp/server.ini.new > server.ini
