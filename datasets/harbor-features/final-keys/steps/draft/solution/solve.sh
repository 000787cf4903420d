#!/bin/bash
printf 'pear\napple\nfig\n' > /app/words.txt
