#!/bin/bash
if [ -s /app/REVIEW.md ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
