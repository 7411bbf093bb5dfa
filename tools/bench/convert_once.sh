#!/usr/bin/env bash
# One CTF -> CBF conversion of a benchmark file, timed: the input is read into the page cache first and the
# output removed, so that runs compare. Prints wall, user and system time, CPU (perf's task-clock when perf
# is there), page faults and peak RSS on one line.
# usage: [BENCH_DIR=dir] convert_once.sh BIN dense|sparse THREADS [extra convert options]
# BENCH_DIR (default ./bench) holds dense.ctf and sparse.ctf from
#   python3 tools/gen_bench_data.py dense|sparse BENCH_DIR/KIND.ctf 1000
set -euo pipefail
bin=$1 kind=$2 threads=$3
shift 3
dir=${BENCH_DIR:-bench}
if [ "$kind" = dense ]; then
    schema=(-s features:100:dense -s labels:10:dense)
else
    schema=(-s features:100000:sparse -s labels:10:sparse)
fi
out="$dir/$kind.cbf"
rm -f "$out"
# The input's pages in the page cache. How they got there matters: a file read from disk is cached in
# large folios, which a mapped read maps a few at a time; a file just written (or partly evicted and read
# back in pieces) can stay cached in 4 KiB pages, and mapping those costs more CPU.
# BENCH_CACHE=reread drops the file's pages first and reads it back in, for the state of a file read
# from disk; the default keeps whatever is cached.
if [ "${BENCH_CACHE:-keep}" = reread ]; then
    dd if="$dir/$kind.ctf" iflag=nocache count=0 status=none
fi
cat "$dir/$kind.ctf" >/dev/null
tm=$(mktemp)
ps=$(mktemp)
trap 'rm -f "$tm" "$ps"' EXIT
if command -v perf >/dev/null; then
    perf stat -e task-clock,page-faults -x, -o "$ps" /usr/bin/time -f "%e %U %S %M" -o "$tm" \
        "$bin" convert -q -j "$threads" "$@" "$dir/$kind.ctf" "$out" "${schema[@]}"
else
    /usr/bin/time -f "%e %U %S %M" -o "$tm" "$bin" convert -q -j "$threads" "$@" "$dir/$kind.ctf" "$out" "${schema[@]}"
fi
read -r wall user sys rss <"$tm"
cpu=$(grep task-clock "$ps" 2>/dev/null | cut -d, -f1)
pf=$(grep page-faults "$ps" 2>/dev/null | cut -d, -f1)
cpu=${cpu:-$(echo "($user + $sys) * 1000" | bc -l)}
printf "%-12s %-6s j%s %s wall %5.2f user %5.2f sys %5.2f cpu %6.0fms pf %6s rss %6.1fMB\n" \
    "$(basename "$bin")" "$kind" "$threads" "$*" "$wall" "$user" "$sys" "$cpu" "${pf:--}" "$(echo "$rss/1024" | bc -l)"
