#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test of the workspace
# (unit, openraft storage suite, multi-process replication tests).
# Idempotent; everything it needs is installed by the project's own scripts.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Builds the coordstore binary too, which the multi-process tests start.
cargo test --workspace
