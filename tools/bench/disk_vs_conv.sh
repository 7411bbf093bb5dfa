#!/usr/bin/env bash
# How long the disk alone takes to write what a sparse conversion writes (dd of 1.07 GB in 2 MiB direct
# writes, to a new file beside the output), alternating with the conversion (-j 2) in the same moments.
# usage: [BENCH_DIR=dir] disk_vs_conv.sh ROUNDS BIN
set -euo pipefail
here=$(dirname "$0")
rounds=$1 bin=$2
dir=${BENCH_DIR:-bench}
log=$(mktemp)
trap 'rm -f "$log" "$dir/dd.out"' EXIT
for _ in $(seq "$rounds"); do
    rm -f "$dir/dd.out"
    s=$(date +%s.%N)
    dd if=/dev/zero of="$dir/dd.out" bs=2M count=509 oflag=direct status=none
    e=$(date +%s.%N)
    rm -f "$dir/dd.out"
    c=$(bash "$here/convert_once.sh" "$bin" sparse 2 | sed 's/.* wall *\([0-9.]*\).*/\1/')
    echo "$(echo "$e - $s" | bc) $c" | tee -a "$log"
done
for k in 1 2; do
    cut -d' ' -f$k "$log" | sort -n | awk -v k=$k '{v[NR]=$1} END{printf "%s median %.2f min %.2f\n", (k==1 ? "dd" : "conversion"), v[int((NR+1)/2)], v[1]}'
done
