#!/bin/bash
# The oracle: what a correct agent does.
set -euo pipefail
cd /app
python3 - <<'EOF'
from pathlib import Path
Path("kv.py").write_text(
    "def parse(text: str) -> dict[str, str]:\n"
    "    \"\"\"'a=1;b=2' -> {'a': '1', 'b': '2'}.\"\"\"\n"
    "    result = {}\n"
    "    for item in text.split(\";\"):\n"
    "        if not item.strip():\n            continue\n"
    "        key, value = item.split(\"=\", 1)\n"
    "        result[key.strip()] = value.strip()\n"
    "    return result\n"
)
EOF
