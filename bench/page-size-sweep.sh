#!/usr/bin/env bash
# Issue 16 item 6(b): page-size sweep of random reads (out of memory) and cold/warm scans,
# 4 KiB ... 1 MiB, strata against the hashpool and raw O_DIRECT reads.
#
#   bench/page-size-sweep.sh STRATA_BIN OUT_DIR
#
# Writes OUT_DIR/random-read-sweep.{json,png}, OUT_DIR/scan-<size>.json and OUT_DIR/sweep.log; data go to
# ./.bench-scratch (removed afterwards).
set -u
BIN=$1
OUT=$2
mkdir -p "$OUT" .bench-scratch
t0=$SECONDS
"$BIN" bench random-read --memory out --page-size 4096,16384,65536,262144,1048576 --threads "${THREADS:-1,8}" \
    --seconds 1 --engines strata,hashpool,raw --dir .bench-scratch --json --plot "$OUT/random-read-sweep.png" \
    > "$OUT/random-read-sweep.json" 2>> "$OUT/sweep.log"
echo "random-read sweep: rc $? in $((SECONDS - t0)) s"
for ps in 4096 16384 65536 262144 1048576; do
    t0=$SECONDS
    "$BIN" bench scan --page-size "$ps" --engines strata,raw --rounds 1 --dir .bench-scratch --json \
        > "$OUT/scan-$ps.json" 2>> "$OUT/sweep.log"
    echo "scan $ps: rc $? in $((SECONDS - t0)) s"
done
rm -rf .bench-scratch
