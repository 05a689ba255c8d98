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

# Pick a Python 3.12 interpreter: pyenv's 3.12.1 first, then python3.12 on PATH.
PY=()
if command -v pyenv >/dev/null 2>&1 && PYENV_VERSION=3.12.1 pyenv exec python -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
    PY=(env PYENV_VERSION=3.12.1 pyenv exec python)
elif command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import venv' >/dev/null 2>&1; then
    PY=(python3.12)
else
    log "ERROR: jax/jaxlib 0.12.0.1 need Python 3.12, but neither pyenv's 3.12.1" \
        "(PYENV_VERSION=3.12.1 pyenv exec python) nor python3.12 (with the venv module) was found." \
        "Install one, e.g. 'pyenv install 3.12.1' or 'apt-get install python3.12 python3.12-venv'."
    exit 1
fi

if [[ -e "$VENV" && ! -x "$VENV/bin/python" ]]; then
    log "removing broken venv at $VENV"
    rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv at $VENV with $("${PY[@]}" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    mkdir -p "$ROOT/target"
    "${PY[@]}" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
    log "venv at $VENV is not Python 3.12; recreating"
    rm -rf "$VENV"
    "${PY[@]}" -m venv "$VENV"
fi

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
