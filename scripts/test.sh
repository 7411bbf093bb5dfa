#!/usr/bin/env bash
# Runs every test: the Rust workspace (unit, conformance, differential, property and CLI tests).
# The test material ships in testdata/ (testdata/README.md): a clone needs nothing beside it. Set
# CNTKIO_SHARED_DIR to read it from a folder in the project's shared/ layout instead.
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# Property tests draw their cases from a fixed seed, so a run is reproducible; set PROPTEST_RNG_SEED to
# explore other cases.
export PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-20261121}"
# On a processor with the AVX-512 extensions the parser's vector paths use, the tests that compare them
# with the scalar paths must find them active (not silently compare the scalar paths with themselves).
has_flags() {
    local flags
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null) || return 1
    for f in "$@"; do
        [[ " $flags " == *" $f "* ]] || return 1
    done
}
if has_flags avx512f avx512bw avx512vl avx512dq avx512cd avx512vbmi avx512_vbmi2 bmi1 bmi2 popcnt \
    && [ "${CNTKIO_SIMD:-}" != 0 ]; then
    export CNTKIO_EXPECT_SIMD=1
    echo "test: AVX-512 present; the vector paths are tested against the scalar paths"
else
    echo "test: no AVX-512 (or CNTKIO_SIMD=0); the vector-path tests compare the scalar paths only"
fi
cargo test --workspace --all-targets --no-fail-fast
cargo test --workspace --doc
# A one-off run (CI's) sets CNTKIO_DROP_TEST_BUILD=1: the Rust tests' build (several GB) then goes before
# the Python package's release build and PyTorch come, so a small disk holds each in turn.
if [[ "${CNTKIO_DROP_TEST_BUILD:-}" == "1" ]]; then
    cargo clean --profile dev
fi
# The Python package: built with maturin, installed into a venv, tested with pytest.
bash scripts/test-python.sh -q
