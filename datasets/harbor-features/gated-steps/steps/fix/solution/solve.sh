#!/bin/bash
echo 2 > /app/counter.txt
