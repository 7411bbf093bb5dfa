#!/usr/bin/env bash
# Memory against the number of sequences: files of N one-sample lines ("|a 1", 5 bytes each) and their CBF
# conversions, and the peak RSS and time of validate, inspect, convert and randomized minibatches (from CTF
# with a window of 2 chunks of 1 MB, from CBF with a window of 100,000 samples) for each N. What should
# not grow with N is everything but the time. Prints a Markdown table.
# usage: [BENCH_DIR=dir] [BIN=path/to/cntkio] tools/bench/memory.sh [N ...]   (default: 10000000 100000000)
# The files (5 bytes per line, plus the CBF) are made in BENCH_DIR (default ./bench) when missing.
set -euo pipefail
dir=${BENCH_DIR:-bench}
bin=${BIN:-target/release/cntkio}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(10000000 100000000)
mkdir -p "$dir"
tm=$(mktemp)
trap 'rm -f "$tm" "$dir"/memory-out.cbf' EXIT

run() {
    local what=$1 n=$2
    shift 2
    /usr/bin/time -o "$tm" -f "%e %M" "$@" >/dev/null 2>&1 || {
        echo "failed: $*" >&2
        return 1
    }
    read -r secs kb <"$tm"
    printf '| %s | %s | %.2f | %.0f |\n' "$what" "$n" "$secs" "$(awk -v kb="$kb" 'BEGIN { print kb / 1024 }')"
}

echo "| command | lines | s | peak MiB |"
echo "|---|---|---|---|"
for n in "${sizes[@]}"; do
    ctf="$dir/tiny-$n.ctf"
    cbf="$dir/tiny-$n.cbf"
    # `yes` ends on SIGPIPE when `head` has its lines: the pipeline's status is head's alone.
    [ -f "$ctf" ] || (set +o pipefail; yes '|a 1' | head -n "$n" >"$ctf")
    [ -f "$cbf" ] || "$bin" -q convert "$ctf" "$cbf" -s a:1:dense
    run "validate" "$n" "$bin" -q validate "$ctf" -s a:1:dense
    run "inspect" "$n" "$bin" -q inspect "$ctf"
    run "inspect (CBF)" "$n" "$bin" -q inspect "$cbf"
    run "convert → CBF" "$n" "$bin" -q convert "$ctf" "$dir/memory-out.cbf" -s a:1:dense
    run "batches, randomized, 2 chunks of 1 MB" "$n" \
        "$bin" -q batches "$ctf" -s a:1:dense --mb-size 256 --randomize --window-chunks 2 --chunk-size 1000000 --bench
    run "batches (CBF), randomized, window 100000" "$n" \
        "$bin" -q batches "$cbf" --mb-size 256 --randomize --window-samples 100000 --bench
done
