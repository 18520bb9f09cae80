#!/usr/bin/env bash
# Install the six agent CLIs that the gateway e2e tests drive, at their pinned versions.
#
#   scripts/install_harnesses.sh [DIR]      # default DIR: <repo>/.polar-tools
#
# Each CLI goes into its own npm prefix, DIR/<name>/<version>/, and its binary is at
# DIR/<name>/<version>/node_modules/.bin/<bin>. A marker file (.installed) per version makes
# reruns no-ops. tests/e2e reads the same layout (POLAR_TOOLS overrides DIR there).
#
# Pins (docs/harnesses.md): Qwen Code 0.24.4 needs Node >= 22 to run; npm here only
# unpacks them (any Node), and they run on the tools folder's Node 22 (`polar harness install node`, from PyPI).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-${POLAR_TOOLS:-$ROOT/.polar-tools}}"

# name  package  version  binary
HARNESSES=(
  "codex        @openai/codex                  0.171.0  codex"
  "claude       @anthropic-ai/claude-code      2.1.332  claude"
  "gemini       @google/gemini-cli             0.61.0   gemini"
  "qwen         @qwen-code/qwen-code           0.24.4   qwen"
  "opencode     opencode-ai                    1.18.33  opencode"
  "pi           @mariozechner/pi-coding-agent  0.73.1   pi"
)

command -v npm >/dev/null || { echo "npm not found: install Node first" >&2; exit 1; }
mkdir -p "$DIR"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

for line in "${HARNESSES[@]}"; do
  read -r name pkg version bin <<<"$line"
  prefix="$DIR/$name/$version"
  if [[ -f "$prefix/.installed" && -x "$prefix/node_modules/.bin/$bin" ]]; then
    echo "$name $version: already installed"
    continue
  fi
  echo "$name $version: installing $pkg@$version into $prefix"
  start=$SECONDS
  rm -rf "$prefix"
  mkdir -p "$prefix"
  npm install --prefix "$prefix" --no-save --loglevel=error "$pkg@$version" >"$prefix/npm-install.log" 2>&1 || {
    cat "$prefix/npm-install.log" >&2
    echo "$name: npm install failed" >&2
    exit 1
  }
  [[ -x "$prefix/node_modules/.bin/$bin" ]] || { echo "$name: $bin missing after install" >&2; exit 1; }
  echo "$pkg@$version" >"$prefix/.installed"
  echo "$name $version: done in $((SECONDS - start)) s, $(du -sh "$prefix" | cut -f1)"
done
echo "harnesses in $DIR ($(du -sh "$DIR" | cut -f1))"
