#!/bin/bash
# The oracle: what a correct agent does.
set -euo pipefail
cd /app
python3 - <<'EOF'
import csv, json
totals = {}
for row in csv.DictReader(open("sales.csv")):
    totals[row["region"]] = totals.get(row["region"], 0) + float(row["amount"])
json.dump(totals, open("totals.json", "w"))
EOF
