#!/bin/bash
# [environment] env reaches the agent; [solution] env only the oracle
echo "$FEATURE_GREETING $SOLUTION_WORD" > /app/out.txt
