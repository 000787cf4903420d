#!/bin/bash
echo checked > /app/answer.txt
