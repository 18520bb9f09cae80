#!/usr/bin/env bash
# Build the separate virtualenv that runs the LiteLLM proxy for benchmarks/bench_gateway.py.
#
# Contract: after a zero exit, "$VENV/bin/litellm --config FILE --port N" starts the LiteLLM proxy and the
# marker file "$VENV/.polar-litellm-ready" names the pinned version. A second run with the marker present and
# matching is instant. LiteLLM lives in its own venv because litellm[proxy] pins a FastAPI range that
# conflicts with Prefect's cap (fastapi<0.151) in the project venv.
#
# The pin is a release from before the compromised 1.107.x line (pulled from PyPI) and after the pulled
# 1.82.7/1.82.8; do not float it.
#
# Usage: scripts/litellm_env.sh [VENV]   (default: <repo>/.venv-litellm)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-litellm}"
LITELLM_VERSION="1.106.12"
MARKER="$VENV/.polar-litellm-ready"
WANT="litellm[proxy]==$LITELLM_VERSION"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" && -x "$VENV/bin/litellm" ]]; then
    echo "litellm env ready: $VENV ($WANT)"
    exit 0
fi

start=$(date +%s)
rm -f "$MARKER"
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet "$WANT"
# Fail here, not at proxy start, if the import is broken.
LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/python" -c "import litellm.proxy.proxy_server" >/dev/null
echo "$WANT" > "$MARKER"
echo "litellm env built in $(( $(date +%s) - start )) s: $VENV ($WANT)"
