#!/usr/bin/env bash
# What the local runtime's boundary needs (polar/runtime/bwrap.py, tests/runtime/test_local_sandbox.py): Debian's
# bubblewrap. Installs it only when missing, then checks that it works here: a kernel or container may refuse its
# namespaces, and then POLAR_RUNTIME_ISOLATION=auto runs commands on the host with a warning (said here too; the
# boundary's tests skip, or fail under CI=true).
set -euo pipefail
if ! command -v bwrap >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
fi
if ! bwrap --ro-bind / / --proc /proc --dev /dev --unshare-pid --unshare-ipc --unshare-uts true; then
  echo "sandbox_env.sh: warning: bwrap is installed but does not work on this machine" >&2
fi
