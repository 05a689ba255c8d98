#!/usr/bin/env bash
# Prepares (idempotently) what `coordstore-bench` needs besides the workspace:
#   * etcd 3.4 for the etcd peer: Debian's etcd-server and etcd-client packages,
#     fetched with `apt-get download` and unpacked with `dpkg -x` into
#     target/etcd. Nothing is installed system-wide and no etcd service is
#     started (a plain `apt-get install etcd-server` would start one on 2379).
#   * a TrueType font for the charts' labels: the system's DejaVu Sans if
#     present, else Debian's fonts-dejavu-core unpacked into target/fonts.
# The jaxlib venv comes from scripts/setup-jax.sh.
#
# Fast no-op when both are there. Prints `etcd=<path>` and `font=<path>`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

log() { echo "setup-bench: $*" >&2; }

# unpack DEST PACKAGE... : apt-get download + dpkg -x into DEST.
unpack() {
    local dest="$1"
    shift
    command -v apt-get >/dev/null || { log "ERROR: apt-get not found (Debian packages $* are needed)"; exit 1; }
    mkdir -p "$dest/debs"
    if ! (cd "$dest/debs" && apt-get download "$@") >&2 2>/dev/null; then
        log "apt-get download $* failed; refreshing the package lists and retrying"
        apt-get update -qq >&2
        (cd "$dest/debs" && apt-get download "$@") >&2
    fi
    for deb in "$dest"/debs/*.deb; do
        dpkg -x "$deb" "$dest"
    done
}

ETCD_DIR="$ROOT/target/etcd"
ETCD="$ETCD_DIR/usr/bin/etcd"
# (Output captured first: with pipefail, `etcd --version | grep -q` fails
# whenever grep exits before etcd has written everything.)
is_34() { [[ -x "$ETCD" ]] && [[ "$("$ETCD" --version 2>/dev/null)" == *"etcd Version: 3.4."* ]]; }
if ! is_34; then
    unpack "$ETCD_DIR" etcd-server etcd-client
    is_34 || { log "ERROR: unpacked etcd is not 3.4: $("$ETCD" --version 2>&1 | head -1)"; exit 1; }
    log "$("$ETCD" --version | head -1) in $ETCD_DIR"
fi

FONT=""
for f in /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf "$ROOT/target/fonts/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"; do
    if [[ -f "$f" ]]; then FONT="$f"; break; fi
done
if [[ -z "$FONT" ]]; then
    unpack "$ROOT/target/fonts" fonts-dejavu-core
    FONT="$ROOT/target/fonts/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    [[ -f "$FONT" ]] || { log "ERROR: fonts-dejavu-core has no $FONT"; exit 1; }
fi

echo "etcd=$ETCD"
echo "font=$FONT"
