#!/usr/bin/env bash
# A/B of two strata builds on TPC-H queries: each query at each thread count runs ROUNDS
# times per build, the builds alternating (A, B, A, B, ...), each run a fresh process; the
# query's own "seconds" from its JSON. For changes whose effect is smaller than a noisy
# machine's drift over minutes: compare the two builds within one run.
#
#   bench/tpch-ab.sh A_BIN B_BIN DB_DIR [POOL]
#
# Environment: THREADS (default 1,2), QUERIES (default all 22), ROUNDS (default 3); A_ENV and
# B_ENV, settings each build runs with (e.g. B_ENV=STRATA_PARTIAL_READS=1 with A = B: one
# build with a setting off and on).
# Prints one JSON object per query and thread count: {"query", "threads", "a": [seconds],
# "b": [seconds], "b_over_a" (ratio of the minima)}.
set -u
A=$1
B=$2
DB=$3
POOL=${4:-64MiB}
THREADS=${THREADS:-1,2}
QUERIES=${QUERIES:-"q1 q2 q3 q4 q5 q6 q7 q8 q9 q10 q11 q12 q13 q14 q15 q16 q17 q18 q19 q20 q21 q22"}
ROUNDS=${ROUNDS:-3}
SQL=$(cd "$(dirname "$0")/../crates/strata/tests/tpch" && pwd)
secs() {
    local bin=$1 envs=$4
    shift
    # (The settings word-split on purpose: several NAME=VALUE pairs.)
    # shellcheck disable=SC2086
    env $envs "$bin" sql "$DB" --pool "$POOL" --threads "$1" --json --file "$SQL/$2.sql" 2>/dev/null \
        | grep -o '"seconds":[0-9.e+-]*' | cut -d: -f2
}
for q in ${QUERIES//,/ }; do
    for t in ${THREADS//,/ }; do
        a=() b=()
        for _ in $(seq "$ROUNDS"); do
            a+=("$(secs "$A" "$t" "$q" "${A_ENV:-}")")
            b+=("$(secs "$B" "$t" "$q" "${B_ENV:-}")")
        done
        ma=$(printf '%s\n' "${a[@]}" | sort -g | head -1)
        mb=$(printf '%s\n' "${b[@]}" | sort -g | head -1)
        ratio=$(awk -v a="$ma" -v b="$mb" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "null" }')
        echo "{\"query\": \"$q\", \"threads\": $t, \"a\": [$(IFS=,; echo "${a[*]}")], \"b\": [$(IFS=,; echo "${b[*]}")], \"b_over_a\": $ratio}"
    done
done
