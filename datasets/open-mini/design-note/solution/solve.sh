#!/bin/bash
set -e
cd /app
cat > DESIGN.md <<'MD'
# Rate limiter

A token bucket per client: capacity 60, refilled at one token per second. Each request takes a
token or is answered 429 with Retry-After. Buckets live in Redis (one hash per client, updated
by a Lua script so the check and the take are atomic).

Why not a fixed window: bursts at window edges let through twice the limit. A sliding log is
exact but stores every request. The token bucket allows short bursts, costs two numbers per
client, and is one round trip per request.
MD
