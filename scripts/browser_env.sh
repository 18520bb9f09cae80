#!/usr/bin/env bash
# Debian's chromium for the web UI's browser tests (tests/ui): Playwright drives this system browser through
# executable_path; Playwright's own browser downloads are never used. Installs it only when it is missing.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
command -v chromium
