#!/usr/bin/env bash
# Creates (idempotently) the Python venv that the jaxlib interop tests and the
# jaxlib latency bench use: target/jax-venv with jax/jaxlib 0.12.0.1 (which
# need Python >= 3.12) and their dependencies, all pinned.
#
# Fast no-op (< 2 s) when the venv already has exactly these pins: a marker
# file inside the venv records them. Works with no stdin and under CI=true.
# Prints the venv's python path as the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

VENV="$ROOT/target/jax-venv"
PIP_CACHE="$ROOT/target/pip-cache"
MARKER="$VENV/.coordstore-jax-pins"

# Everything pinned, dependencies included, so every machine gets the same set.
PINS=(
    "jax==0.12.0.1"
    "jaxlib==0.12.0.1"
    "ml_dtypes==0.6.0"
    "numpy==2.5.5"
    "opt_einsum==3.4.0"
    "scipy==1.18.1"
)
WANT="$(printf '%s\n' "${PINS[@]}")"

log() { echo "setup-jax: $*" >&2; }

if [[ -x "$VENV/bin/python" && -f "$MARKER" ]] && [[ "$(cat "$MARKER")" == "$WANT" ]]; then
    echo "$VENV/bin/python"
    exit 0
fi

# shellcheck source=lib/py312-venv.sh
source "$ROOT/scripts/lib/py312-venv.sh"
py312_venv "$VENV" "jax/jaxlib 0.12.0.1"

rm -f "$MARKER"
log "installing ${PINS[*]}"
mkdir -p "$PIP_CACHE"
"$VENV/bin/python" -m pip install --no-input --disable-pip-version-check \
    --cache-dir "$PIP_CACHE" --quiet "${PINS[@]}" </dev/null

# Check that the installed set imports and reports the pinned versions.
"$VENV/bin/python" - <<'EOF'
import jax, jaxlib
from jaxlib import _jax
assert jax.__version__ == "0.12.0.1", jax.__version__
assert jaxlib.__version__ == "0.12.0.1", jaxlib.__version__
assert hasattr(_jax, "get_distributed_runtime_client")
assert hasattr(_jax, "get_distributed_runtime_service")
EOF

printf '%s\n' "$WANT" >"$MARKER"
log "done"
echo "$VENV/bin/python"
