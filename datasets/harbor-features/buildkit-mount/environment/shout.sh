#!/bin/sh
cat /etc/shout-greeting
