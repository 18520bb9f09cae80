#!/bin/bash
# The oracle: what a correct agent does.
set -euo pipefail
cd /app
tr 'A-Z' 'a-z' < words.txt | tr -s ' \n' '\n' | grep -v '^$' | sort -u | wc -l > count.txt
