#!/usr/bin/env bash
# Alternating rounds: each round converts once with every build or option given, in turn, so that all of
# them see the same moments of a noisy machine; then the median (and quartiles) of each. Single runs on a
# shared machine vary widely within minutes: compare builds only this way.
# usage: [BENCH_DIR=dir] ab.sh ROUNDS dense|sparse "LABEL:ENV BIN THREADS [extra]" ...
#   ENV is "-" or VAR=value[,VAR=value...] set for that build's runs.
# example: tools/bench/ab.sh 10 sparse "new:- target/release/cntkio 2" "old:- /tmp/cntkio-old 2"
set -euo pipefail
here=$(dirname "$0")
rounds=$1 kind=$2
shift 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for _ in $(seq "$rounds"); do
    for spec in "$@"; do
        label=${spec%%:*} rest=${spec#*:}
        envs=${rest%% *} rest=${rest#* }
        [ "$envs" = - ] && envs=AB_NONE=1
        bin=${rest%% *} rest=${rest#* }
        threads=${rest%% *} extra=${rest#"$threads"}
        # shellcheck disable=SC2086
        line=$(env ${envs//,/ } bash "$here/convert_once.sh" "$bin" "$kind" "$threads" $extra)
        echo "$label $line" >>"$log"
    done
done
quantiles() { sort -n | awk '{v[NR]=$1} END{n=NR; printf "min %.2f q1 %.2f med %.2f q3 %.2f", v[1], v[int((n+3)/4)], v[int((n+1)/2)], v[int((3*n+1)/4)]}'; }
for spec in "$@"; do
    label=${spec%%:*}
    wall=$(grep "^$label " "$log" | sed 's/.* wall *\([0-9.]*\).*/\1/' | quantiles)
    cpu=$(grep "^$label " "$log" | sed 's/.* cpu *\([0-9.]*\)ms.*/\1/' | sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}')
    rss=$(grep "^$label " "$log" | sed 's/.* rss *\([0-9.]*\)MB.*/\1/' | sort -n | tail -1)
    printf "%-8s n=%d wall %s | cpu med %s ms | peak rss %s MB\n" "$label" "$rounds" "$wall" "$cpu" "$rss"
done
