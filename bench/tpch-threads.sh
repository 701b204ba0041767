#!/usr/bin/env bash
# TPC-H thread scaling of strata's executor (issue 15, `--threads`): generates TPC-H at
# scale factor SF, imports it through the pool, then runs every query at each thread count
# (warm: each query once to warm up, then ROUNDS timed runs, each a fresh process; the
# query's own "seconds" and peak RSS from its JSON). Meant for a many-core machine.
#
#   bench/tpch-threads.sh STRATA_BIN OUT_DIR [SF] [POOL]
#
# Environment: THREADS (default 1,2,4,8,16), QUERIES (default all 22), ROUNDS (default 3),
# IMPORT_POOL (the pool of the import; default POOL), WORK (keep the data there; a database
# already in WORK/db is used as it is).
# Writes OUT_DIR/machine.txt and OUT_DIR/tpch-threads.jsonl: one JSON object per query and
# thread count: {"query", "threads", "rounds_seconds": [...], "seconds" (median),
# "peak_rss_bytes" (largest), "rows"}. bench/tpch_threads_plot.py draws it.
set -u
BIN=$1
OUT=$2
SF=${3:-1}
POOL=${4:-64MiB}
THREADS=${THREADS:-1,2,4,8,16}
QUERIES=${QUERIES:-"q1 q2 q3 q4 q5 q6 q7 q8 q9 q10 q11 q12 q13 q14 q15 q16 q17 q18 q19 q20 q21 q22"}
ROUNDS=${ROUNDS:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-$(mktemp -d)}
mkdir -p "$OUT"
"$HERE/machine-info.sh" "sf: $SF, pool: $POOL, rounds: $ROUNDS" > "$OUT/machine.txt" 2>&1
if [ ! -d "$W/db" ]; then
    t0=$SECONDS
    "$BIN" gen tpch --sf "$SF" --out "$W/csv" > /dev/null 2>&1 || exit 1
    echo "gen: $((SECONDS - t0)) s" | tee -a "$OUT/machine.txt"
    t0=$SECONDS
    "$BIN" import-tpch "$W/db" --from "$W/csv" --pool "${IMPORT_POOL:-$POOL}" --json > "$OUT/import.json" || exit 1
    echo "import: $((SECONDS - t0)) s" | tee -a "$OUT/machine.txt"
    rm -rf "$W/csv"
fi
: > "$OUT/tpch-threads.jsonl"
for q in $QUERIES; do
    for t in ${THREADS//,/ }; do
        "$BIN" sql "$W/db" --pool "$POOL" --threads "$t" --json --file "$HERE/../crates/strata/tests/tpch/$q.sql" > /dev/null 2>&1
        secs=() rss=0 rows=0
        for _ in $(seq "$ROUNDS"); do
            j=$("$BIN" sql "$W/db" --pool "$POOL" --threads "$t" --json --file "$HERE/../crates/strata/tests/tpch/$q.sql" 2> "$OUT/err.txt") || { echo "$q t$t failed: $(tail -1 "$OUT/err.txt")" | tee -a "$OUT/machine.txt"; continue; }
            secs+=("$(echo "$j" | grep -o '"seconds":[0-9.e+-]*' | cut -d: -f2)")
            r=$(echo "$j" | grep -o '"peak_rss_bytes":[0-9]*' | cut -d: -f2)
            [ "$r" -gt "$rss" ] && rss=$r
            rows=$(echo "$j" | grep -o '\],\[' | wc -l)
        done
        [ ${#secs[@]} -eq 0 ] && continue
        med=$(printf '%s\n' "${secs[@]}" | sort -g | sed -n "$(( (${#secs[@]} + 1) / 2 ))p")
        list=$(IFS=,; echo "${secs[*]}")
        echo "{\"query\": \"$q\", \"threads\": $t, \"rounds_seconds\": [$list], \"seconds\": $med, \"peak_rss_bytes\": $rss, \"rows\": $((rows + 1))}" >> "$OUT/tpch-threads.jsonl"
        echo "$q t$t ${med}s"
    done
done
[ -z "${WORK:-}" ] && rm -rf "$W"
exit 0
