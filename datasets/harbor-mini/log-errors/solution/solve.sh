#!/bin/bash
# The oracle: what a correct agent does.
set -euo pipefail
cd /app
grep ' ERROR ' app.log > errors.log
