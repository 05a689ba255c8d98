#!/usr/bin/env bash
# Makes a headless-capable Chromium available (Debian's `chromium` package)
# for the status page's browser test (tests/tests/ui.rs), which dumps the
# rendered DOM and takes screenshots. Idempotent; prints chromium's path as
# the last line of stdout.
set -euo pipefail
log() { echo "setup-chromium: $*" >&2; }
# Checks that need chromium may call this at once: one installs, the others
# wait for it (two apt-get runs at once fail on dpkg's lock).
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$ROOT/target"
exec 9>"$ROOT/target/.setup-chromium.lock"
flock 9
find_chromium() {
    command -v chromium 2>/dev/null || command -v chromium-browser 2>/dev/null || true
}
if [[ -z "$(find_chromium)" ]]; then
    SUDO=()
    [[ "$(id -u)" == 0 ]] || SUDO=(sudo)
    log "installing Debian's chromium package"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >&2 </dev/null
fi
CHROMIUM="$(find_chromium)"
if [[ -z "$CHROMIUM" ]]; then
    log "chromium is still not on PATH after installing"
    exit 1
fi
echo "$CHROMIUM"
