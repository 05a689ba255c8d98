#!/usr/bin/env bash
# Creates (idempotently) the Python venv that the PyTorch c10d TCPStore interop
# tests use: target/torch-venv with stock torch 2.15.0 from PyPI (Python 3.12)
# and its dependencies, all pinned. PyPI's default torch wheel is the CUDA
# build (+cu132, ~5.3 GB in the venv with its nvidia-*/cuda-* wheels); it
# imports and runs TCPStore and gloo on a machine without a GPU.
#
# Then builds the coordstore package (python/) as a wheel with maturin from
# target/py-venv (made by scripts/setup-python.sh when missing) and installs
# it into this venv with --no-deps, torch's pins untouched: torchrun's
# `--rdzv-backend coordstore` (its `torchrun.handlers` entry point) and the
# package's relay for the torchrun interop tests.
#
# Fast no-op (< 2 s) when the venv already has exactly these pins and the
# package's sources are as at its last install: marker files inside the venv
# record both. Works with no stdin and under CI=true. Prints the venv's
# python path as the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

VENV="$ROOT/target/torch-venv"
PIP_CACHE="$ROOT/target/pip-cache"
MARKER="$VENV/.coordstore-torch-pins"

# Everything pinned, dependencies included, so every machine gets the same set
# (the list is `pip freeze` of a venv made from torch==2.15.0; installed with
# --no-deps, so this list is exactly what the venv holds besides pip).
PINS=(
    "cuda-bindings==13.5.0"
    "cuda-pathfinder==1.9.1"
    "cuda-toolkit==13.2.2"
    "filelock==4.3.1"
    "fsspec==2026.9.0"
    "Jinja2==3.1.6"
    "MarkupSafe==3.0.4"
    "mpmath==1.3.0"
    "networkx==3.7"
    "nvidia-cublas==13.4.1.3"
    "nvidia-cuda-cccl==13.3.5.0.6"
    "nvidia-cuda-cupti==13.2.86"
    "nvidia-cuda-nvrtc==13.2.86"
    "nvidia-cuda-runtime==13.2.86"
    "nvidia-cudnn-cu13==9.26.0.51"
    "nvidia-cufft==12.2.0.57"
    "nvidia-cufile==1.17.1.22"
    "nvidia-cusolver==12.2.0.11"
    "nvidia-cusparse==12.7.10.12"
    "nvidia-cusparselt-cu13==0.8.1"
    "nvidia-nccl-cu13==2.30.7"
    "nvidia-nvjitlink==13.5.37"
    "nvidia-nvshmem-cu13==3.7.2"
    "nvidia-nvtx==13.2.86"
    "setuptools==84.2.1"
    "sympy==1.14.0"
    "torch==2.15.0"
    "triton==3.9.0"
    "typing_extensions==4.16.0"
)
WANT="$(printf '%s\n' "${PINS[@]}")"

log() { echo "setup-torch: $*" >&2; }

install_torch() {
    # shellcheck source=lib/py312-venv.sh
    source "$ROOT/scripts/lib/py312-venv.sh"
    py312_venv "$VENV" "the PyTorch TCPStore interop tests"

    rm -f "$MARKER"
    log "installing torch 2.15.0 and ${#PINS[@]} pinned packages (about 5 GB)"
    mkdir -p "$PIP_CACHE"
    "$VENV/bin/python" -m pip install --no-input --disable-pip-version-check \
        --cache-dir "$PIP_CACHE" --quiet --no-deps "${PINS[@]}" </dev/null

    # Check that the installed set imports, reports the pinned version, and
    # that a libuv TCPStore server and client work on loopback (no GPU needed).
    "$VENV/bin/python" - <<'PYEOF'
import warnings
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
from datetime import timedelta
import torch
import torch.distributed as dist
assert torch.__version__.split("+")[0] == "2.15.0", torch.__version__
assert dist.is_available() and dist.is_gloo_available()
server = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True,
                       wait_for_workers=False, timeout=timedelta(seconds=10))
assert server.libuvBackend
client = dist.TCPStore("127.0.0.1", server.port, is_master=False, use_libuv=True,
                       timeout=timedelta(seconds=10))
client.set("k", b"v")
assert server.get("k") == b"v"
assert client.add("n", 2) == 2
del client, server
PYEOF

    printf '%s\n' "$WANT" >"$MARKER"
    log "torch installed"
}

if ! [[ -x "$VENV/bin/python" && -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" ]]; then
    install_torch
fi

# The coordstore package. Its wheel holds python/ and the extension built
# from the crates python/, agent/ and proto/ (and the workspace's lock): a
# fingerprint of those files (tracked or not, ignored ones left out) and of
# the build profile tells whether the installed one is current.
PKG_MARKER="$VENV/.coordstore-package"
PYVENV="$ROOT/target/py-venv"
PROFILE="${COORDSTORE_PY_PROFILE:-dev}"
WHEELS="$ROOT/target/torch-venv-wheel"

package_fingerprint() {
    {
        echo "profile $PROFILE"
        git -C "$ROOT" ls-files -z -c -o --exclude-standard -- \
            python agent proto Cargo.toml Cargo.lock |
            sort -z -u |
            while IFS= read -r -d '' f; do
                [[ -f "$f" ]] && sha256sum "$f"
            done
    } | sha256sum | cut -d' ' -f1
}

PKG_WANT="$(package_fingerprint)"
if [[ -f "$PKG_MARKER" && "$(cat "$PKG_MARKER")" == "$PKG_WANT" ]] &&
    "$VENV/bin/python" -c 'import coordstore._native' 2>/dev/null; then
    echo "$VENV/bin/python"
    exit 0
fi

if ! [[ -x "$PYVENV/bin/maturin" ]]; then
    log "making target/py-venv for maturin (scripts/setup-python.sh)"
    "$ROOT/scripts/setup-python.sh" >/dev/null
fi
rm -f "$PKG_MARKER"
rm -rf "$WHEELS"
log "building ($PROFILE) the coordstore wheel and installing it (--no-deps)"
PATH="$PYVENV/bin:$PATH" CARGO_TARGET_DIR="$ROOT/target" "$PYVENV/bin/maturin" build \
    --quiet --profile "$PROFILE" -m python/Cargo.toml --out "$WHEELS" </dev/null >&2
"$VENV/bin/python" -m pip install --no-input --disable-pip-version-check --quiet \
    --no-index --no-deps --force-reinstall "$WHEELS"/coordstore-*.whl </dev/null
# torchrun finds the handler through the entry point.
"$VENV/bin/python" - <<'PYEOF'
from importlib.metadata import entry_points
import coordstore._native
names = [e.name for e in entry_points(group="torchrun.handlers")]
assert "coordstore" in names, names
PYEOF
printf '%s\n' "$PKG_WANT" >"$PKG_MARKER"
log "done"
echo "$VENV/bin/python"
