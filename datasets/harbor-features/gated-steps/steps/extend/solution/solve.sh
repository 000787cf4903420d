#!/bin/bash
echo 3 >> /app/counter.txt
