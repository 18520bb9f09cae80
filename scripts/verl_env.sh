#!/usr/bin/env bash
# Build the overlay that lets the verl adapter's test import verl 0.9.1's agent-loop classes.
#
# verl 0.9.1 cannot be installed into the project venv as pip resolves it: it requires transformers <5.11 (we pin
# >=5.19; 5.24 is installed) and tensordict 0.10.0, which requires packaging <26 (26.4 is installed), so pip would
# downgrade transformers, tokenizers, huggingface_hub and packaging. Its agent-loop module imports fine on CPU
# against our versions, so this installs verl and the few packages that import needs, --no-deps, into a separate
# --target folder that is put on PYTHONPATH over the project venv (only by the test that needs it; the venv itself
# and `pip check` stay untouched).
#
# Contract: after a zero exit, "PYTHONPATH=$SITE .venv/bin/python -c 'import verl.experimental.agent_loop'" works
# and "$SITE/.polar-verl-ready" names the pinned set; a second run with the marker present is instant.
# Usage: scripts/verl_env.sh [SITE]   (default: <repo>/.verl-site, git-ignored)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SITE="${1:-$ROOT/.verl-site}"
PY="$ROOT/.venv/bin/python"
PINS=(verl==0.9.1 tensordict==0.10.0 ray==2.60.0 protobuf==7.36.2 msgpack==1.2.4 hydra-core==1.3.8 omegaconf==2.3.1
      antlr4-python3-runtime==4.9.3 codetiming==1.4.0 lazy-importer==0.1.0 pyvers==0.1.0 pylatexenc==2.11
      torchdata==0.11.0 peft==0.21.2)
MARKER="$SITE/.polar-verl-ready"
WANT="${PINS[*]}"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" ]]; then
    echo "verl overlay ready: $SITE"
    exit 0
fi
start=$(date +%s)
rm -rf "$SITE"
"$PY" -m pip install --quiet --no-deps --target "$SITE" "${PINS[@]}"
PYTHONPATH="$SITE" "$PY" -c "import verl.experimental.agent_loop" >/dev/null
echo "$WANT" > "$MARKER"
echo "verl overlay built in $(( $(date +%s) - start )) s: $SITE"
