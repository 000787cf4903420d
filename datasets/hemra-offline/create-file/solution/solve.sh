#!/bin/bash
set -e
cd /app
printf 'hello, world\n' > hello.txt
