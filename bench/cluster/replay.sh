#!/bin/bash
# bench/cluster/replay.sh - this tree's cost model on a stored planner run: every
# cell's probe (kept by run.sh --plan in plan_probes*.jsonl) planned again with
# `zr plan`, and the run's measured rows (plan_rows*.jsonl) priced by it.
#
# usage: bench/cluster/replay.sh [--zr PATH] [--json | --rows] [SUFFIX...]
#        SUFFIX: "" (plan_rows.jsonl + plan_probes.jsonl), -repeat, -quick, ... in
#        bench/cluster/results/; a directory (run.sh --plan --out DIR) instead
#        reads DIR/plan_rows.jsonl and DIR/plan_probes.jsonl
#
# Why: one run of the planner's benchmark takes 8-17 minutes, and on a shared
# machine two runs of one cost model differ by more than two versions of it
# (bench/cluster/README.md). Replayed on the same probes and measurements, two
# versions differ only by the model. Prints per cell the mean |error| and the
# mean error of the replayed prices, per run the MAPE over its rows, and
# whether the replayed pick is a configuration the run measured (its tokens/s
# over the cell's best, else "-"); --json: one summary line per run; --rows: the
# priced rows instead, one JSON line each (cell, mode, config, step_ms,
# tokens_per_s, old_pred_ms as run, pred_ms replayed, err).
# Needs jq and a built zr (default build/release/zr).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ZR=$ROOT/build/release/zr
JSON=0
runs=()
while [ $# -gt 0 ]; do
    case $1 in
        --zr) ZR=$2; shift 2 ;;
        --json) JSON=1; shift ;;
        --rows) JSON=2; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) runs+=("$1"); shift ;;
    esac
done
[ ${#runs[@]} -gt 0 ] || runs=("")
[ -x "$ZR" ] || { echo "replay.sh: no zr at $ZR (make, or --zr PATH)" >&2; exit 2; }
command -v jq >/dev/null || { echo "replay.sh: needs jq" >&2; exit 2; }

# PLAN_MODEL and PLAN_CONFIG_JQ: the model and the row naming of the run
# shellcheck source=plan.sh
. "$HERE/plan.sh"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

for run in "${runs[@]}"; do
    if [ -d "$run" ]; then
        rows=$run/plan_rows.jsonl probes=$run/plan_probes.jsonl name=$run
    else
        rows=$HERE/results/plan_rows$run.jsonl probes=$HERE/results/plan_probes$run.jsonl
        name=plan_rows$run
    fi
    for f in "$rows" "$probes"; do
        [ -s "$f" ] || { echo "replay.sh: $f: missing or empty" >&2; exit 1; }
    done
    : >"$TMP/priced.jsonl"
    : >"$TMP/cells.jsonl"
    ncell=$(jq -s length "$probes")
    for i in $(seq 0 $((ncell - 1))); do
        cell=$(jq -s -r ".[$i].cell" "$probes")
        jq -s ".[$i].probe" "$probes" >"$TMP/probe.json"
        "$ZR" plan "${PLAN_MODEL[@]}" --probe "$TMP/probe.json" --json >"$TMP/plan.json" \
            2>"$TMP/plan.log" ||
            { echo "replay.sh: $name, $cell: zr plan failed:" >&2; cat "$TMP/plan.log" >&2; exit 1; }
        # each measured row of the cell with the replayed price of its configuration
        jq -c --arg cell "$cell" --slurpfile plan "$TMP/plan.json" "$PLAN_CONFIG_JQ"'
            select(.layout + " " + .rate == $cell)
            | .config as $c | ($plan[0].configs | map(select(config == $c)))[0] as $p
            | if $p == null then error("\($cell): no plan row for \($c)") else . end
            | {cell: $cell, mode, config, step_ms, tokens_per_s, old_pred_ms: .pred_step_ms,
               pred_ms: $p.step_ms, err: (($p.step_ms - .step_ms) / .step_ms)}' "$rows" \
            >>"$TMP/priced.jsonl"
        jq -c --arg cell "$cell" "$PLAN_CONFIG_JQ"'
            (.configs[0] | config) as $pick | {cell: $cell, pick: $pick}' "$TMP/plan.json" \
            >>"$TMP/cells.jsonl"
    done
    jq -s -c --arg run "$name" --slurpfile cells "$TMP/cells.jsonl" '
        def mean: if length == 0 then null else add / length end;
        . as $r
        | {run: $run, rows: length, mape: (map(.err | fabs) | mean),
           old_mape: (map((.old_pred_ms - .step_ms) / .step_ms | fabs) | mean),
           cells: [$cells[] | . as $c | ($r | map(select(.cell == $c.cell))) as $rs
                   | ($rs | map(.tokens_per_s) | max) as $best
                   | ($rs | map(select(.config == $c.pick)) | .[0]) as $m
                   | {cell: $c.cell, pick: $c.pick, mape: ($rs | map(.err | fabs) | mean),
                      bias: ($rs | map(.err) | mean),
                      pick_vs_best: (if $m == null then null else $m.tokens_per_s / $best end)}]}' \
        "$TMP/priced.jsonl" >"$TMP/summary.json"
    if [ $JSON = 1 ]; then
        cat "$TMP/summary.json"
    elif [ $JSON = 2 ]; then
        cat "$TMP/priced.jsonl"
    else
        jq -r '"\(.run): MAPE \(.mape * 1000 | round / 1000) over \(.rows) rows (as run: \(.old_mape * 1000 | round / 1000))",
               (.cells[] | "  \(.cell): mean |error| \(.mape * 1000 | round / 1000), mean error \(.bias * 1000 | round / 1000), pick \(.pick): \(if .pick_vs_best == null then "not measured" else "\(.pick_vs_best * 1000 | round / 1000) of the best measured" end)")' \
            "$TMP/summary.json"
    fi
done
