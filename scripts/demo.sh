#!/usr/bin/env bash
# Builds cntkio and runs it on the sample data shipped in examples/data: inspect, validate, dump, convert
# CTF -> CBF -> CTF, and a short benchmark. Usage: bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p cntkio-cli
B=target/release/cntkio
D=examples/data
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
set -x
$B inspect $D/slots.ctf
$B validate --config $D/slots.cntk --data-dir $D
$B validate $D/logreg.ctf --stream features:2:dense --stream labels:1:dense
$B dump --config $D/slots.cntk --data-dir $D | head -n 2
$B convert $D/slots.ctf "$OUT/slots.cbf" --config $D/slots.cntk --data-dir $D
$B inspect "$OUT/slots.cbf"
$B convert "$OUT/slots.cbf" "$OUT/slots.back.ctf" --stream query:13:sparse:word --stream intent:5:sparse:intent --stream slots:12:sparse:slot
$B dump "$OUT/slots.cbf" | head -n 1
$B bench $D/logreg.ctf --stream features:2:dense --stream labels:1:dense --repeat 3
