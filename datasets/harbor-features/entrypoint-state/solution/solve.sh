#!/bin/bash
cp /srv/state/token /app/answer.txt
id -u >> /app/answer.txt
