#!/usr/bin/env bash
# Creates (idempotently) target/py-venv, the Python 3.12 venv the Python
# package's tests use: maturin, pytest, cloudpickle, numpy and stock
# jax/jaxlib 0.12.0.1 (pinned), then builds and installs ./python (the
# `coordstore` package) into it with the workspace's target/ directory.
#
# The pins install once (a marker file records them); the package is
# rebuilt every run (cargo makes that incremental). Works with no stdin and
# under CI=true. Prints the venv's python path as the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

VENV="$ROOT/target/py-venv"
PIP_CACHE="$ROOT/target/pip-cache"
MARKER="$VENV/.coordstore-py-pins"

# Everything pinned, dependencies included (`pip freeze` of the venv).
PINS=(
    "cloudpickle==3.1.1"
    "iniconfig==2.3.1"
    "jax==0.12.0.1"
    "jaxlib==0.12.0.1"
    "maturin==1.9.6"
    "ml_dtypes==0.6.0"
    "numpy==2.5.5"
    "opt_einsum==3.4.0"
    "packaging==26.3"
    "pluggy==1.7.0"
    "Pygments==2.21.0"
    "pytest==8.4.2"
    "scipy==1.18.1"
)
WANT="$(printf '%s\n' "${PINS[@]}")"

log() { echo "setup-python: $*" >&2; }

if ! [[ -x "$VENV/bin/python" && -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" ]]; then
    # shellcheck source=lib/py312-venv.sh
    source "$ROOT/scripts/lib/py312-venv.sh"
    py312_venv "$VENV" "the Python package's tests"
    rm -f "$MARKER"
    log "installing ${PINS[*]}"
    mkdir -p "$PIP_CACHE"
    "$VENV/bin/python" -m pip install --no-input --disable-pip-version-check \
        --cache-dir "$PIP_CACHE" --quiet --no-deps "${PINS[@]}" </dev/null
    printf '%s\n' "$WANT" >"$MARKER"
fi

# The tests build the extension with the dev profile (it shares the
# workspace's debug dependencies; `pip install ./python` alone builds it
# optimised). COORDSTORE_PY_PROFILE=release for an optimised one.
PROFILE="${COORDSTORE_PY_PROFILE:-dev}"
log "building ($PROFILE) and installing ./python"
MATURIN_PEP517_ARGS="--profile $PROFILE" PATH="$VENV/bin:$PATH" CARGO_TARGET_DIR="$ROOT/target" "$VENV/bin/python" -m pip install --no-input \
    --disable-pip-version-check --cache-dir "$PIP_CACHE" --quiet \
    --no-build-isolation --no-deps --force-reinstall ./python </dev/null
"$VENV/bin/python" -c 'import coordstore, coordstore._native' >/dev/null
echo "$VENV/bin/python"
