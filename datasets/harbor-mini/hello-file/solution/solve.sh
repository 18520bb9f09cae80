#!/bin/bash
# The oracle: what a correct agent does.
set -euo pipefail
cd /app
echo 'hello, polar' > /app/greeting.txt
