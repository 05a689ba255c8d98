#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test of the workspace
# (unit, openraft storage suite, multi-process replication and fault tests,
# stock-jaxlib and stock-TensorFlow interop tests), then the Python package's
# pytest suite. Idempotent; everything it
# needs is installed by the project's own scripts (the jaxlib venv goes to
# target/jax-venv, the TensorFlow one to target/tf-venv).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-jax.sh >/dev/null
scripts/setup-tf.sh >/dev/null
scripts/setup-torch.sh >/dev/null
scripts/setup-prometheus.sh >/dev/null
scripts/setup-chromium.sh >/dev/null
# The build before namespaces, for the rolling-upgrade tests: built once
# (sharing this checkout's dependencies) and cached under target/prev-build.
scripts/setup-prev-build.sh >/dev/null

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# No function over 70 lines outside the tests, in every crate (the bench and
# the test harness included; clippy.toml holds the threshold).
cargo clippy --workspace --lib --bins -- -D warnings -W clippy::too_many_lines
# No module cycles in any crate (the script names the cycle and fails).
python3 scripts/module-cycles.py --self-test
# No service source file over 600 lines, the README at most 400.
scripts/size-limits.sh
deploy/monitoring/check.sh
# The multi-process tests start the coordstore binary (target/debug/coordstore);
# `cargo test` alone builds only its test harness.
cargo build -p coordstore-service --bin coordstore
# Bounded fuzzing (libFuzzer, a few seconds per target).
scripts/fuzz.sh
cargo test --workspace
# The Python package (python/): built into target/py-venv, tested with pytest
# against real clusters of the binary built above.
PY="$(scripts/setup-python.sh | tail -n 1)"
"$(dirname "$PY")/pytest" -q python/tests
