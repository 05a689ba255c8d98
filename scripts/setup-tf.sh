#!/usr/bin/env bash
# Creates (idempotently) the Python venv that the TensorFlow interop tests
# use: target/tf-venv with stock tensorflow-cpu 2.21.0 (Python 3.12) and its
# dependencies, all pinned.
#
# Fast no-op (< 2 s) when the venv already has exactly these pins: a marker
# file inside the venv records them. Works with no stdin and under CI=true.
# Prints the venv's python path as the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

VENV="$ROOT/target/tf-venv"
PIP_CACHE="$ROOT/target/pip-cache"
MARKER="$VENV/.coordstore-tf-pins"

# Everything pinned, dependencies included, so every machine gets the same set
# (the list is `pip freeze` of a venv made from tensorflow-cpu==2.21.0).
PINS=(
    "absl-py==2.5.1"
    "astunparse==1.6.3"
    "certifi==2026.10.18"
    "charset-normalizer==3.5.2"
    "flatbuffers==25.12.19"
    "gast==0.7.0"
    "google-pasta==0.2.0"
    "grpcio==1.85.1"
    "h5py==3.14.0"
    "idna==3.20"
    "keras==3.15.1"
    "libclang==18.1.1"
    "markdown-it-py==4.3.0"
    "mdurl==0.1.2"
    "ml_dtypes==0.6.0"
    "namex==0.1.0"
    "numpy==2.5.5"
    "opt_einsum==3.4.0"
    "optree==0.20.0"
    "packaging==26.3"
    "protobuf==7.36.2"
    "Pygments==2.21.0"
    "requests==2.34.2"
    "rich==15.0.0"
    "setuptools==84.2.1"
    "six==1.17.0"
    "tensorflow_cpu==2.21.0"
    "termcolor==3.3.0"
    "typing_extensions==4.16.0"
    "urllib3==2.8.0"
    "wheel==0.48.0"
    "wrapt==2.5.2"
)
WANT="$(printf '%s\n' "${PINS[@]}")"

log() { echo "setup-tf: $*" >&2; }

if [[ -x "$VENV/bin/python" && -f "$MARKER" ]] && [[ "$(cat "$MARKER")" == "$WANT" ]]; then
    echo "$VENV/bin/python"
    exit 0
fi

# shellcheck source=lib/py312-venv.sh
source "$ROOT/scripts/lib/py312-venv.sh"
py312_venv "$VENV" "the TensorFlow interop tests"

rm -f "$MARKER"
log "installing tensorflow-cpu 2.21.0 and ${#PINS[@]} pinned packages"
mkdir -p "$PIP_CACHE"
"$VENV/bin/python" -m pip install --no-input --disable-pip-version-check \
    --cache-dir "$PIP_CACHE" --quiet --no-deps "${PINS[@]}" </dev/null

# Check that the installed set imports and reports the pinned version.
TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" - <<'PYEOF'
import tensorflow as tf
from tensorflow.python.eager import context
assert tf.__version__ == "2.21.0", tf.__version__
assert hasattr(context.context(), "configure_coordination_service")
assert hasattr(context.context(), "get_task_states")
PYEOF

printf '%s\n' "$WANT" >"$MARKER"
log "done"
echo "$VENV/bin/python"
