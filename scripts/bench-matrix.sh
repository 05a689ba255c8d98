#!/usr/bin/env bash
# Side-by-side KV runs of several coordstore settings (or builds) beside
# etcd, interleaved over rounds, with one summary table:
#
#   scripts/bench-matrix.sh RESULTS_DIR ROUNDS SECONDS VARIANT...
#   bash bench-pack/matrix.sh RESULTS_DIR ROUNDS SECONDS VARIANT...
#
# VARIANT is `name=FLAGS` or `name:BUILD=FLAGS`: FLAGS are `coordstore
# serve` flags as coordstore-bench's --server-flags takes them (commas,
# e.g. `w4=--worker-threads,4`; nothing after `=` for the defaults), BUILD
# an extra build of a bench pack (bin/coordstore-BUILD, from EXTRA_BINS of
# scripts/bench-pack.sh). Each round runs `kv --seconds SECONDS` for
# etcd3, then for coordstore3 under each variant, the variants' order
# rotated by one each round (machines drift within a run). The summary
# gives each run's 1-client put p50 and 64 / 256-client put ops/s and
# their ratio to the etcd run of the same round. Inside a bench pack it
# runs the pack's binaries (run.sh); in the source tree the release build.
# LOAD_THREADS=N gives the load generator N tokio workers (coordstore-bench
# --load-threads; default 2, which caps every peer at many clients on a
# large machine).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
[[ $# -ge 4 ]] || { sed -n 2,17p "$0" >&2; exit 2; }
OUT="$1" ROUNDS="$2" SECS="$3"
shift 3
VARIANTS=("$@")
mkdir -p "$OUT"
LOAD=()
[[ -n "${LOAD_THREADS:-}" ]] && LOAD=(--load-threads "$LOAD_THREADS")

if [[ -f "$HERE/run.sh" ]]; then
    bench() { bash "$HERE/run.sh" "$@"; }
    binof() { echo "$HERE/bin/coordstore-$1"; }
else
    ROOT="$(cd "$HERE/.." && pwd)"
    bench() { local out="$1"; shift; "$ROOT/target/release/coordstore-bench" --out "$out" "$@"; }
    binof() { echo "$ROOT/target/release/coordstore-$1"; }
fi

# The KV rows of one run: "ops/s of put 1 | p50 of put 1 | ops/s 64 | ops/s 256".
rows() {
    awk -F'|' -v peer="$2" '
        $2 ~ peer && $3 ~ /put/ {
            gsub(/ /, "", $4); gsub(/ /, "", $5); gsub(/ /, "", $6)
            if ($4 == "1/1") { p50 = $6 } else if ($4 ~ /^64\//) { c64 = $5 } else if ($4 ~ /^256\//) { c256 = $5 }
        }
        END { printf "%s %s %s\n", p50 == "" ? "-" : p50, c64 == "" ? "-" : c64, c256 == "" ? "-" : c256 }
    ' "$1"
}

SUMMARY="$OUT/matrix.md"
{
    echo "Rounds: $ROUNDS, kv --seconds $SECS, $(nproc) cores, load generator ${LOAD_THREADS:-2} workers; ratio = coordstore / etcd of the same round (p50: lower is better)."
    echo
    echo "| round | run | 1-client put p50 ms | 64 clients ops/s | 256 clients ops/s | p50 ratio | 64 ratio | 256 ratio |"
    echo "|---|---|---|---|---|---|---|---|"
} >"$SUMMARY"
n=${#VARIANTS[@]}
for ((r = 1; r <= ROUNDS; r++)); do
    log="$OUT/r$r-etcd3.log"
    bench "$OUT/r$r-etcd3" "${LOAD[@]}" --peers etcd3 kv --seconds "$SECS" >"$log" 2>&1
    read -r e50 e64 e256 < <(rows "$log" "etcd")
    echo "| $r | etcd3 | $e50 | $e64 | $e256 | | | |" >>"$SUMMARY"
    for ((k = 0; k < n; k++)); do
        v="${VARIANTS[$(((k + r - 1) % n))]}"
        name="${v%%=*}" flags="${v#*=}"
        build=""
        [[ "$name" == *:* ]] && { build="${name#*:}"; name="${name%%:*}"; }
        log="$OUT/r$r-$name.log"
        args=("${LOAD[@]}" --peers coordstore3)
        [[ -n "$flags" ]] && args+=("--server-flags=$flags")
        if [[ -n "$build" ]]; then
            COORDSTORE_BIN="$(binof "$build")" bench "$OUT/r$r-$name" "${args[@]}" kv --seconds "$SECS" >"$log" 2>&1
        else
            bench "$OUT/r$r-$name" "${args[@]}" kv --seconds "$SECS" >"$log" 2>&1
        fi
        read -r c50 c64 c256 < <(rows "$log" "coordstore 3 nodes")
        ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else printf "-" }'; }
        echo "| $r | $name | $c50 | $c64 | $c256 | $(ratio "$c50" "$e50") | $(ratio "$c64" "$e64") | $(ratio "$c256" "$e256") |" >>"$SUMMARY"
    done
done
cat "$SUMMARY"
