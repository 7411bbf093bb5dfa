#!/usr/bin/env bash
# CTF → Parquet with cntkio against CSV → Parquet with polars (`pl.scan_csv(...).sink_parquet(...)`) on the
# same numbers, side by side in one run: wall time and peak RSS of each (GNU time), both writing zstd.
# The CSV is made from the CTF file (the dense benchmark file: `|features` 100 values, `|labels` 10; no
# sequence ids) into WORK and removed at the end, as are the outputs.
# usage: arrow_vs_polars.sh BIN PYTHON [RUNS]
#   BIN: a release build of cntkio; PYTHON: a Python with polars installed.
#   BENCH_DIR (default ./bench) holds dense.ctf (python3 tools/gen_bench_data.py dense BENCH_DIR/dense.ctf 1000).
#   WORK (default /tmp) is where the CSV and the outputs go.
set -euo pipefail
bin=$1 py=$2 runs=${3:-3}
dir=${BENCH_DIR:-bench}
work=$(mktemp -d "${WORK:-/tmp}/arrow_vs_polars.XXXXXX")
trap 'rm -rf "$work"' EXIT
ctf="$dir/dense.ctf"
csv="$work/dense.csv"
# `|features a b … |labels c d …` → `a,b,…,c,d,…`
sed -e 's/^|features //' -e 's/ *|labels / /' -e 's/ *$//' -e 's/ \+/,/g' "$ctf" >"$csv"
schema=(-s features:100:dense -s labels:10:dense)
cat "$ctf" "$csv" >/dev/null

measure() { # label, command…: prints "label wall_s peak_rss_MiB"
    local label=$1
    shift
    local tm
    tm=$(mktemp)
    /usr/bin/time -v -o "$tm" "$@" >/dev/null
    local wall rss
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s}' "$tm")
    rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$tm")
    rm -f "$tm"
    echo "$label $wall $rss"
}

echo "# machine: $(nproc) cores; input $(stat -c %s "$ctf") bytes CTF, $(stat -c %s "$csv") bytes CSV"
echo "# tool wall_s peak_rss_MiB output_bytes"
# float32 columns, as cntkio writes the streams (polars would infer float64).
polars_py='import polars as pl, sys
schema = {f"column_{i + 1}": pl.Float32 for i in range(110)}
pl.scan_csv(sys.argv[1], has_header=False, schema=schema).sink_parquet(sys.argv[2], compression="zstd")'
for _ in $(seq "$runs"); do
    rm -f "$work/cntkio.parquet" "$work/polars.parquet"
    echo "$(measure cntkio "$bin" convert -q "$ctf" "$work/cntkio.parquet" "${schema[@]}") $(stat -c %s "$work/cntkio.parquet")"
    echo "$(measure polars "$py" -c "$polars_py" "$csv" "$work/polars.parquet") $(stat -c %s "$work/polars.parquet")"
done
