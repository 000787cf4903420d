#!/bin/bash
sort -o /app/words.txt /app/words.txt
