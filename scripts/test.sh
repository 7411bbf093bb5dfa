#!/usr/bin/env bash
# Runs every test: the Rust workspace (unit, conformance, differential, property and CLI tests).
# The conformance material is read from ../shared beside the repository (or $CNTKIO_SHARED_DIR).
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# Property tests draw their cases from a fixed seed, so a run is reproducible; set PROPTEST_RNG_SEED to
# explore other cases.
export PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-20261121}"
cargo test --workspace --all-targets --no-fail-fast
cargo test --workspace --doc
# The Python package: built with maturin, installed into a venv, tested with pytest.
bash scripts/test-python.sh -q
