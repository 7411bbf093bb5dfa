#!/usr/bin/env bash
# How a whole pass scales with threads: validate, convert and randomized minibatches of the benchmark
# files at -j 1, 2, 4, 8, 16 (those up to the machine's cores), each a fresh process, with its wall time,
# rate, peak RSS and minor page faults per GB of input. Prints a Markdown table.
# usage: [BENCH_DIR=dir] [BIN=path/to/cntkio] tools/bench/threads.sh [dense|sparse ...]
# BENCH_DIR (default ./bench) holds KIND.ctf from `python3 tools/gen_bench_data.py KIND BENCH_DIR/KIND.ctf
# 1000`; KIND.cbf is made from it when missing. The output of convert goes to BENCH_DIR and is removed.
set -euo pipefail
dir=${BENCH_DIR:-bench}
bin=${BIN:-target/release/cntkio}
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(dense)
cores=$(nproc)
threads=()
for j in 1 2 4 8 16; do
    [ "$j" -le "$cores" ] && threads+=("$j")
done
tm=$(mktemp)
trap 'rm -f "$tm" "$dir"/threads-out.cbf' EXIT

# Runs one command; prints "| what | -j | s | GB/s | peak MB | faults/GB |".
run() {
    local what=$1 j=$2 bytes=$3
    shift 3
    /usr/bin/time -o "$tm" -f "%e %M %R" "$@" >/dev/null 2>&1 || {
        echo "failed: $*" >&2
        return 1
    }
    read -r secs kb faults <"$tm"
    awk -v w="$what" -v j="$j" -v s="$secs" -v kb="$kb" -v f="$faults" -v b="$bytes" 'BEGIN {
        gb = b / 1e9
        printf "| %s | %d | %.2f | %.2f | %.0f | %.0f |\n", w, j, s, (s > 0 ? gb / s : 0), kb / 1024, f / gb
    }'
}

echo "cntkio: $("$bin" --version 2>/dev/null || echo "$bin"); $cores cores"
echo
echo "| pass | -j | s | GB/s of input | peak MB | minor faults per GB |"
echo "|---|---|---|---|---|---|"
for kind in "${kinds[@]}"; do
    if [ "$kind" = dense ]; then
        schema=(-s features:100:dense -s labels:10:dense)
    else
        schema=(-s features:100000:sparse -s labels:10:sparse)
    fi
    ctf="$dir/$kind.ctf"
    cbf="$dir/$kind.cbf"
    [ -f "$cbf" ] || "$bin" -q convert "$ctf" "$cbf" "${schema[@]}"
    cat "$ctf" "$cbf" >/dev/null
    ctf_bytes=$(stat -c %s "$ctf")
    cbf_bytes=$(stat -c %s "$cbf")
    for j in "${threads[@]}"; do
        run "validate $kind.ctf" "$j" "$ctf_bytes" "$bin" -q validate "$ctf" "${schema[@]}" -j "$j"
        run "convert $kind.ctf → CBF" "$j" "$ctf_bytes" "$bin" -q convert "$ctf" "$dir/threads-out.cbf" "${schema[@]}" -j "$j"
        rm -f "$dir/threads-out.cbf"
        run "batches $kind.cbf, randomized, 4096" "$j" "$cbf_bytes" \
            "$bin" -q batches "$cbf" --mb-size 4096 --randomize --seed 1 --bench -j "$j"
    done
done
