#!/usr/bin/env bash
# Scaling runs of issue 16 (item 5): `strata bench fix` and `random-read` (out of memory) at
# 1, 4, 8 and 16 threads, on a many-core machine. Optionally the same runs with an earlier
# build (OLD_BIN) in the same session, so that the two can be compared as ratios.
#
#   bench/device-scaling.sh STRATA_BIN OUT_DIR [OLD_BIN]
#
# Writes OUT_DIR/{machine.txt, fix.json, fix.png, random-read.json, random-read.png} and, with
# OLD_BIN, OUT_DIR/{fix-before.json, random-read-before.json}. Data files go to
# ./.bench-scratch (removed afterwards).
set -u
BIN=$1
OUT=$2
OLD=${3:-}
T=${THREADS:-1,4,8,16}
mkdir -p "$OUT" .bench-scratch
"$(dirname "$0")/machine-info.sh" > "$OUT/machine.txt" 2>&1
run() { # name bin args...
    local name=$1 bin=$2
    shift 2
    local t0=$SECONDS
    "$bin" bench "$@" --dir .bench-scratch --json > "$OUT/$name.json" 2> "$OUT/$name.err"
    echo "$name: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/machine.txt"
}
run fix "$BIN" fix --threads "$T" --plot "$OUT/fix.png"
[ -n "$OLD" ] && run fix-before "$OLD" fix --threads "$T"
run random-read "$BIN" random-read --memory out --page-size 65536,4096 --threads "$T" --seconds 1 \
    --engines strata,strata-recycle,hashpool,raw --plot "$OUT/random-read.png"
[ -n "$OLD" ] && run random-read-before "$OLD" random-read --memory out --page-size 65536 --threads "$T" --seconds 1 --engines strata,hashpool
rm -rf .bench-scratch
