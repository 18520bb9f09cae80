#!/bin/bash
# The oracle: what a correct agent does.
set -euo pipefail
cd /app
python3 - <<'EOF'
from pathlib import Path
Path("fizzbuzz.py").write_text(
    "def fizzbuzz(n: int) -> str:\n"
    "    if n % 15 == 0:\n        return \"FizzBuzz\"\n"
    "    if n % 3 == 0:\n        return \"Fizz\"\n"
    "    if n % 5 == 0:\n        return \"Buzz\"\n"
    "    return str(n)\n"
)
EOF
