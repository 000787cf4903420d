#!/bin/bash
# runs in [environment] workdir
echo final > notes.txt
pwd > where.txt
