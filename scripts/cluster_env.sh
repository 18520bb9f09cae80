#!/usr/bin/env bash
# What the multi-host test (tests/cluster) needs besides Python: Debian's haproxy, iproute2 (ip netns) and curl.
# Installs only what is missing.
set -euo pipefail
missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v curl >/dev/null 2>&1 || missing+=(curl)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
