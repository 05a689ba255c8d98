#!/usr/bin/env bash
# Builds (once) the coordstore binary of an earlier commit for the upgrade
# tests (tests/tests/upgrade.rs): by default eb5f867, the last build before
# namespaces (journal level 2). The binary is cached as
# target/prev-build/<commit>/coordstore; a second run is a no-op (< 1 s).
# Prints the binary's path as the last line of stdout.
#
# The commit's sources come from this repository's history (git archive)
# and are built in this checkout's own target dir (the debug profile), so
# every dependency the two builds share is compiled once; the earlier
# build's binary is copied out and removed from target/debug, so the next
# `cargo build` of this checkout links its own again.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
COMMIT="${1:-eb5f867}"
OUT="$ROOT/target/prev-build/$COMMIT"
BIN="$OUT/coordstore"
log() { echo "setup-prev-build: $*" >&2; }

mkdir -p "$ROOT/target/prev-build"
exec 9>"$ROOT/target/prev-build/.lock"
flock 9
if [[ -x "$BIN" ]]; then
    echo "$BIN"
    exit 0
fi
if ! git rev-parse --verify --quiet "$COMMIT^{commit}" >/dev/null; then
    log "commit $COMMIT is not in this clone's history (a shallow clone?): fetch it first"
    exit 1
fi
SRC="$ROOT/target/prev-build/src-$COMMIT"
rm -rf "$SRC"
mkdir -p "$SRC"
git archive "$COMMIT" | tar -x -C "$SRC"
log "building coordstore at $COMMIT (shares this checkout's target dir)"
start=$SECONDS
# Its own binary goes where this checkout's goes: move it out at once.
ours="$ROOT/target/debug/coordstore"
[[ -e "$ours" ]] && mv "$ours" "$ours.setup-prev-build"
restore() { [[ -e "$ours.setup-prev-build" ]] && mv -f "$ours.setup-prev-build" "$ours"; return 0; }
trap restore EXIT
(cd "$SRC" && CARGO_TARGET_DIR="$ROOT/target" cargo build --locked -q -p coordstore-service --bin coordstore)
mkdir -p "$OUT"
mv "$ROOT/target/debug/coordstore" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
restore
trap - EXIT
rm -rf "$SRC"
log "built $BIN in $((SECONDS - start)) s"
echo "$BIN"
