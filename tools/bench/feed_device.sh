#!/usr/bin/env bash
# The feed's figures on a machine with many cores and a GPU, in one run: writes the dense benchmark file
# (tools/gen_bench_data.py, MB megabytes of CTF, default 1000) and its CBF twin, then prints
# `cntkio batches --bench` (batches of 4096, shuffled) at -j 1, 2, 4, 8, 16 (those up to the machine's cores,
# each twice) and python/bench_feed.py on the CBF file (with its CUDA rows where PyTorch sees a GPU, and
# DataLoader rows with 2 workers and with half the cores).
#
# usage: [PYTHON=python3] [MB=1000] [REPEAT=3] tools/bench/feed_device.sh [DIR]
#   PYTHON: an interpreter that imports cntkio (its wheel installed, or on PYTHONPATH) and, for the torch
#           rows, PyTorch. DIR (default /tmp/cntkio-feed) holds the data (about 1.5 GB at MB=1000).
#
# On a machine of its own, from the repository root, with the wheel built here (.whl/ is ignored by git, so
# a device call names it in its carry list):
#   python3 -m pip wheel --no-deps -w .whl .
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/cntkio-*.whl
#   PYTHONPATH=/tmp/site tools/bench/feed_device.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
dir=${1:-/tmp/cntkio-feed}
mb=${MB:-1000}
repeat=${REPEAT:-3}
streams=(--stream features:100:dense --stream labels:10:dense)
mkdir -p "$dir"
if [ ! -f "$dir/dense.cbf" ]; then
    python3 tools/gen_bench_data.py dense "$dir/dense.ctf" "$mb"
    "$py" -m cntkio -q convert "$dir/dense.ctf" "$dir/dense.cbf" "${streams[@]}"
    rm -f "$dir/dense.ctf"
fi
cores=$(nproc)
echo "$(nproc) cores; $("$py" -c 'import cntkio; print("cntkio", cntkio.__version__)' 2>/dev/null || echo cntkio)"
echo
echo "| cntkio batches dense.cbf --mb-size 4096 --randomize --bench | M samples/s |"
echo "|---|---|"
for j in 1 2 4 8 16; do
    [ "$j" -le "$cores" ] || continue
    for round in 1 2; do
        rate=$("$py" -m cntkio -q batches "$dir/dense.cbf" --mb-size 4096 --randomize --seed 1 --bench -j "$j" |
            "$py" -c 'import json, sys; print("%.2f" % (json.load(sys.stdin)["samples_per_second"] / 1e6))')
        echo "| -j $j (round $round) | $rate |"
    done
done
echo
# DataLoader rows with 2 workers, and with half the cores where that is more (what a user of many cores sets).
workers=(--workers 2)
[ $((cores / 2)) -le 2 ] || workers+=(--workers $((cores / 2)))
PYTHONUNBUFFERED=1 "$py" python/bench_feed.py "$dir/dense.cbf" --repeat "$repeat" --skip CNTK "${workers[@]}"
