#!/usr/bin/env bash
# Runs every test: the Rust workspace (unit, conformance, differential, property and CLI tests).
# The conformance material is read from ../shared beside the repository (or $CNTKIO_SHARED_DIR).
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets --no-fail-fast
cargo test --workspace --doc
# The Python package: built with maturin, installed into a venv, tested with pytest.
bash scripts/test-python.sh -q
