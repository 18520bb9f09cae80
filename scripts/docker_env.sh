#!/usr/bin/env bash
# A Docker engine and Polar's base image for the Docker runtime tests, made on this machine.
#
#   scripts/docker_env.sh start     # install docker.io if missing, start dockerd unless one answers, build the image
#   scripts/docker_env.sh stop      # stop the dockerd this script started (by the PID in its pid file)
#
# The engine runs without a bridge or iptables rules (--bridge=none --iptables=false): containers get
# `network none` (only lo) or, when asked for, the host's network. Its state lives under $POLAR_DOCKER_DIR.
# The base image is never pulled: debootstrap builds a Debian minbase root from the Debian mirror (git, python3
# and pytest included: what artifact collection and the evaluators run), cached as a tarball under
# $POLAR_IMAGE_CACHE, and `docker import` turns it into $POLAR_DOCKER_IMAGE, labelled with its package list (a
# changed list rebuilds it).
set -euo pipefail

DIR="${POLAR_DOCKER_DIR:-/var/lib/polar-docker}"
SOCK="${POLAR_DOCKER_SOCK:-/var/run/docker.sock}"
IMAGE="${POLAR_DOCKER_IMAGE:-polar/base:bookworm}"
CACHE="${POLAR_IMAGE_CACHE:-${POLAR_TEST_CACHE:-$HOME/.cache/polar}/images}"
MIRROR="${POLAR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PIDFILE="$DIR/dockerd.pid"
PACKAGES="git,python3,python3-pytest,procps"
TARBALL="$CACHE/debian-bookworm-minbase-$(echo "$PACKAGES" | sha256sum | cut -c1-12).tar"

answers() { docker -H "unix://$SOCK" version >/dev/null 2>&1; }

start() {
  if ! command -v dockerd >/dev/null; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io >/dev/null
  fi
  mkdir -p "$DIR"
  if ! answers; then
    rm -f "$PIDFILE"
    dockerd --data-root "$DIR/data" --exec-root "$DIR/exec" --host "unix://$SOCK" --pidfile "$PIDFILE" \
      --bridge=none --iptables=false --ip-forward=false --ip-masq=false >"$DIR/dockerd.log" 2>&1 &
    echo "$!" >"$DIR/started.pid"
    for _ in $(seq 1 100); do answers && break; sleep 0.2; done
    answers || { tail -20 "$DIR/dockerd.log" >&2; echo "dockerd did not start" >&2; exit 1; }
    echo "dockerd started (pid $(cat "$DIR/started.pid"), socket $SOCK)"
  else
    echo "dockerd already answers on $SOCK"
  fi
  have="$(docker -H "unix://$SOCK" image inspect -f '{{ index .Config.Labels "polar.packages" }}' "$IMAGE" 2>/dev/null || true)"
  if [[ "$have" == "$PACKAGES" ]]; then
    echo "image $IMAGE present"
    return
  fi
  if [[ ! -s "$TARBALL" ]]; then
    command -v debootstrap >/dev/null || {
      apt-get update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null
    }
    root="$(mktemp -d)"
    echo "debootstrap minbase into $root"
    debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" >"$DIR/debootstrap.log" 2>&1 || {
      tail -20 "$DIR/debootstrap.log" >&2; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    mkdir -p "$CACHE"
    tar -C "$root" -cf "$TARBALL.tmp" . && mv "$TARBALL.tmp" "$TARBALL"
    rm -rf "$root"
  fi
  docker -H "unix://$SOCK" import -c 'CMD ["/bin/bash"]' -c "LABEL polar.packages=$PACKAGES" "$TARBALL" "$IMAGE" >/dev/null
  echo "image $IMAGE imported from $TARBALL"
}

stop() {
  [[ -f "$DIR/started.pid" ]] || return 0
  pid="$(cat "$DIR/started.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$DIR/started.pid"
  umount "$DIR/exec/netns/default" 2>/dev/null || true
  echo "dockerd (pid $pid) stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
