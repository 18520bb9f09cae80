#!/bin/bash
# The oracle: what a correct agent does.
set -euo pipefail
cd /app
grep -rl calc_total --include='*.py' shop | xargs sed -i 's/calc_total/compute_total/g'
