#!/bin/bash
set -e
shout > /app/out.txt
