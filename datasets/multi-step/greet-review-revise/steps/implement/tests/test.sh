#!/bin/bash
cd /app && python3 -c 'from greet import greet; assert greet("Ann") == "Hello, Ann"' && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
