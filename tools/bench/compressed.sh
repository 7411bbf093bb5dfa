#!/usr/bin/env bash
# `cntkio validate` of a zstd-compressed CTF file against `zstd -dc FILE > /dev/null` alone, in alternating
# rounds (so that both see the same moments of a noisy machine), then the median wall time of each and
# their ratio. The compressed copies are made in a temporary directory (TMPDIR) and deleted at the end.
# usage: compressed.sh ROUNDS CTF BIN [validate args...]
# example: tools/bench/compressed.sh 5 /root/bench/dense.ctf target/release/cntkio \
#            -s features:100:dense -s labels:10:dense
#   FORMS (default "zstd"): "zstd" is one frame as the zstd tool writes it (decompressed by cntkio's spool
#   thread while validate parses); "pzstd" is one frame per 4 MiB piece, concatenated (read directly,
#   several frames at once).
set -euo pipefail
rounds=$1 ctf=$2 bin=$3
shift 3
forms=${FORMS:-zstd}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for form in $forms; do
    case $form in
        zstd) zstd -q -T0 "$ctf" -o "$dir/zstd.zst" ;;
        pzstd)
            split -b 4M "$ctf" "$dir/piece."
            for p in "$dir"/piece.*; do zstd -q -c "$p"; rm "$p"; done >"$dir/pzstd.zst"
            ;;
    esac
done
wall() { /usr/bin/time -f %e "$@" 2>&1 >/dev/null | tail -n 1; }
log=$(mktemp)
for _ in $(seq "$rounds"); do
    for form in $forms; do
        echo "$form zstd-dc $(wall zstd -q -dc "$dir/$form.zst")" >>"$log"
        echo "$form validate $(wall "$bin" validate --quiet "$@" "$dir/$form.zst")" >>"$log"
    done
done
median() { sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
for form in $forms; do
    d=$(grep "^$form zstd-dc " "$log" | awk '{print $3}' | median)
    v=$(grep "^$form validate " "$log" | awk '{print $3}' | median)
    echo "$form ($(stat -c %s "$dir/$form.zst") bytes): zstd -dc median ${d}s, cntkio validate median ${v}s, ratio $(awk -v a="$v" -v b="$d" 'BEGIN{printf "%.2f", a/b}')"
done
rm -f "$log"
