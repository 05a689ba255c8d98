#!/usr/bin/env bash
# Packs the benchmark for a machine without the source tree or a toolchain
# (a larger x86-64 Linux box):
#
#   scripts/bench-pack.sh [DEST]          # default target/bench-pack
#   # copy DEST there, then, there:
#   bash DEST/run.sh RESULTS_DIR --peers coordstore3,etcd3 kv --seconds 4
#
# DEST holds the release `coordstore` and `coordstore-bench` (stripped,
# gzipped), etcd 3.4 and the chart font from scripts/setup-bench.sh, the
# Python scripts the jaxlib peers run, and run.sh. Extra builds to compare
# side by side go in with `EXTRA_BINS="name=/path/to/coordstore ..."`; run.sh
# unpacks each as bin/coordstore-<name>, e.g.
# `COORDSTORE_BIN=$PACK/bin/coordstore-base bash run.sh ...`.
# Everything travels gzipped (about 30 MiB in all). `bash DEST/matrix.sh`
# (scripts/bench-matrix.sh) runs several settings or builds beside etcd,
# interleaved, with one summary table.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
DEST="${1:-$ROOT/target/bench-pack}"

# Two builds: `--bin` would apply to both packages, leaving the bench out.
cargo build --release -p coordstore-service --bin coordstore >&2
cargo build --release -p coordstore-bench >&2
TOOLS="$(bash scripts/setup-bench.sh)"
ETCD="$(sed -n 's/^etcd=//p' <<<"$TOOLS")"
FONT="$(sed -n 's/^font=//p' <<<"$TOOLS")"

rm -rf "$DEST"
mkdir -p "$DEST"/{gz,scripts,bench/python,tests/python}
pack() { # pack NAME FILE: stripped when it is an ELF binary, gzipped
    local tmp="$DEST/gz/$1"
    cp "$2" "$tmp"
    strip "$tmp" 2>/dev/null || true
    gzip -9 "$tmp"
}
pack coordstore target/release/coordstore
pack coordstore-bench target/release/coordstore-bench
pack etcd "$ETCD"
for extra in ${EXTRA_BINS:-}; do
    pack "coordstore-${extra%%=*}" "${extra#*=}"
done
cp "$FONT" "$DEST/gz/DejaVuSans.ttf"
cp scripts/setup-bench.sh "$DEST/scripts/"
cp scripts/bench-matrix.sh "$DEST/matrix.sh"
cp bench/python/*.py "$DEST/bench/python/"
cp tests/python/*.py "$DEST/tests/python/"
git rev-parse --short HEAD >"$DEST/COMMIT" 2>/dev/null || echo unknown >"$DEST/COMMIT"

cat >"$DEST/run.sh" <<'EOF'
#!/usr/bin/env bash
# bash run.sh RESULTS_DIR [coordstore-bench arguments]: unpacks this pack
# (once) and runs coordstore-bench with its results in RESULTS_DIR.
# COORDSTORE_BIN picks another packed build; COORDSTORE_JAX_PYTHON a
# Python with jaxlib for the jaxlib peers (default: python3).
set -euo pipefail
PACK="$(cd "$(dirname "$0")" && pwd)"
OUTDIR="$1"
shift
mkdir -p "$PACK/bin" "$PACK/target/etcd/usr/bin" "$PACK/target/fonts/usr/share/fonts/truetype/dejavu"
for f in "$PACK"/gz/*.gz; do
    name="$(basename "$f" .gz)"
    [[ -x "$PACK/bin/$name" ]] || { gunzip -c "$f" >"$PACK/bin/$name"; chmod +x "$PACK/bin/$name"; }
done
cp -f "$PACK/bin/etcd" "$PACK/target/etcd/usr/bin/etcd"
cp -f "$PACK/gz/DejaVuSans.ttf" "$PACK/target/fonts/usr/share/fonts/truetype/dejavu/"
export COORDSTORE_WORKSPACE="$PACK"
export COORDSTORE_BIN="${COORDSTORE_BIN:-$PACK/bin/coordstore}"
export COORDSTORE_JAX_PYTHON="${COORDSTORE_JAX_PYTHON:-$(command -v python3 || true)}"
echo "coordstore-bench of $(cat "$PACK/COMMIT") with $COORDSTORE_BIN on $(nproc) cores" >&2
exec "$PACK/bin/coordstore-bench" --out "$OUTDIR" "$@"
EOF
chmod +x "$DEST/run.sh"
du -sh "$DEST" >&2
echo "$DEST"
