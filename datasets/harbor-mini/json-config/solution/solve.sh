#!/bin/bash
# The oracle: what a correct agent does.
set -euo pipefail
cd /app
python3 - <<'EOF'
import json
config = json.load(open("config.json"))
config.update(debug=False, port=8080)
json.dump(config, open("config.json", "w"), indent=2)
EOF
