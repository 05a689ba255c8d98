#!/usr/bin/env bash
# Bounded libFuzzer runs of every cargo-fuzz target (fuzz/). Default 5 s
# each; FUZZ_SECONDS=N for longer. cargo-fuzz is installed (idempotently)
# into target/tools; the machine's stable toolchain runs it with
# RUSTC_BOOTSTRAP=1 (cargo-fuzz needs -Z sanitizer flags).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
TOOLS="$ROOT/target/tools"
export PATH="$TOOLS/bin:$PATH"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz into $TOOLS" >&2
    cargo install cargo-fuzz --version 0.13.2 --locked --root "$TOOLS" >&2
fi
SECONDS_EACH="${FUZZ_SECONDS:-5}"
cd fuzz
for target in journal_apply wire_decode torch_decode; do
    echo "fuzz: $target for ${SECONDS_EACH}s" >&2
    RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$target" -- \
        -max_total_time="$SECONDS_EACH" -print_final_stats=0 2>&1 | tail -1
done
