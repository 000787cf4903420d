#!/bin/bash
echo "hello from hemra" > /app/greeting.txt
