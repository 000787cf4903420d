#!/bin/bash
echo final > /app/notes.txt
