#!/usr/bin/env bash
# Makes Prometheus' promtool available (Debian's `prometheus` package) for
# the metrics test, which checks the /metrics exposition with
# `promtool check metrics`. Idempotent; prints promtool's path as the last
# line of stdout.
set -euo pipefail
log() { echo "setup-prometheus: $*" >&2; }
# Tests that need promtool call this at once: one installs, the others wait
# for it (two apt-get runs at once fail on dpkg's lock).
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$ROOT/target"
exec 9>"$ROOT/target/.setup-prometheus.lock"
flock 9
if ! command -v promtool >/dev/null 2>&1; then
    SUDO=()
    [[ "$(id -u)" == 0 ]] || SUDO=(sudo)
    log "installing Debian's prometheus package (for promtool)"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2 </dev/null
    # The package starts a Prometheus server where systemd runs; the test
    # needs only promtool.
    "${SUDO[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
command -v promtool
