#!/bin/bash
cd /app && python3 -c 'from greet import greet; assert greet("  Ann ") == "Hello, Ann" and greet("Bo") == "Hello, Bo"' && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
