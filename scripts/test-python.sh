#!/usr/bin/env bash
# Builds and installs the Python package `cntkio` (pip install .[test]: maturin, release, abi3) into a
# virtual environment and runs its pytest suite (python/tests). The real-data tests read testdata/real
# (or $CNTKIO_SHARED_DIR/data/real, as tools/testdata.py says).
#
# Usage: bash scripts/test-python.sh [pytest args…]
#   CNTKIO_VENV=DIR     the virtual environment to create or reuse (default: target/py-venv)
#   CNTKIO_NO_VENV=1    install into the current interpreter instead ($PYTHON, default python3)
#   CNTKIO_NO_TORCH=1   do not install PyTorch (its tests are then skipped, with the reason)
#   CNTKIO_AZURITE=FILE the `azurite-blob` command of the Azure tests (default: installed from npm into
#                       target/azurite where npm exists; without npm, those tests are skipped, with the reason)
#
# The first build compiles the extension and the `cntkio` command in release mode: about 4–5 minutes on 2
# cores (later builds reuse target/). PyTorch (the `torch` extra) comes from PyPI with its CUDA libraries:
# about 2.8 GB to download and install, once per venv (pip's cache keeps the wheels).
# Python ≥ 3.9 and a Rust toolchain are needed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [[ "${CNTKIO_NO_VENV:-}" != "1" ]]; then
    venv="${CNTKIO_VENV:-target/py-venv}"
    if [[ ! -x "$venv/bin/python" ]]; then
        "$PYTHON" -m venv "$venv"
    fi
    PYTHON="$venv/bin/python"
    "$PYTHON" -m pip install --quiet --upgrade pip
fi
start=$(date +%s)
"$PYTHON" -m pip install --quiet ".[test]"
# PyTorch (the `torch` extra) comes last and alone: with its CUDA libraries it takes about 5.6 GB once
# installed and 2.8 GB more while pip downloads it. Where the disk has less room than that, or the
# install fails, its tests are skipped (each says why) rather than failing the whole run.
if [[ "${CNTKIO_NO_TORCH:-}" != "1" ]] && ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    free_kb=$(df -Pk "$(dirname "$PYTHON")" | awk 'NR == 2 { print $4 }')
    if (( free_kb < 10 * 1024 * 1024 )); then
        echo "test-python: only $(( free_kb / 1024 )) MiB free on disk, PyTorch needs about 10 GiB to" \
            "install: it is left out and its tests are skipped" >&2
    elif ! "$PYTHON" -m pip install --quiet ".[torch]"; then
        echo "test-python: PyTorch could not be installed (above, why): its tests are skipped" >&2
    fi
fi
echo "test-python: built and installed cntkio in $(( $(date +%s) - start )) s" >&2
# Azurite, the local Azure Blob Storage of the Azure tests (which look for it in target/azurite), comes
# from npm: about 30 s and 190 MB, once.
azurite=target/azurite/node_modules/.bin/azurite-blob
if [[ -z "${CNTKIO_AZURITE:-}" && ! -x "$azurite" ]] && command -v npm >/dev/null; then
    npm install --prefix target/azurite --no-audit --no-fund --loglevel=error azurite@3 >/dev/null \
        || echo "test-python: npm could not install Azurite: the Azure tests are skipped" >&2
fi
# Run from python/tests' parent with the installed package (not the source tree's python/cntkio, which
# has no compiled extension): pytest's rootdir is the repository (pyproject.toml), imports use site-packages.
exec "$PYTHON" -m pytest -p no:cacheprovider "$@"
