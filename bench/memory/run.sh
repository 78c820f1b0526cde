#!/bin/bash
# bench/memory/run.sh - peak resident memory per rank as the OS counts it,
# against the engine's formula, for two model sizes at W = 1, 2, 4 and the
# emulated 2x2 layout (issue 16). Each point is its own mpirun launch of
# "zr bench memory --json" (stage 3, hpZ/qwZ/qgZ off, T=64, B=1, one step),
# so no run inherits another's heap. Then one pair of runs at T=1024 with and
# without activation checkpointing (memory saved, time added).
#
# usage: bench/memory/run.sh [--json] [--quick] [--sizes "85m 302m"] [--zr PATH] [--out FILE]
#   --quick   only the 85M model, and the T=1024 pair on a small model
#   --json    the summary JSON is the last line of stdout (it always is
#             written to --out, default bench/memory/results.json)
# About 5 minutes on 2 free cores with both sizes (the 302M model at W=1
# holds ~5 GB).
#
# Summary keys: rss_over_formula_max (the worst rank of the worst run),
# runs (one object per launch as zr bench memory prints it, plus "layout"),
# checkpointing {rss_saved_bytes, time_added_ratio, ...}.
set -u
cd "$(dirname "$0")/../.."
. scripts/mpienv.sh

ZR="$PWD/build/release/zr"
JSON=0
SIZES="85m 302m"
OUT="bench/memory/results.json"
CKPT_MODEL=(--layers 6 --channels 384 --heads 6)
while [ $# -gt 0 ]; do
    case "$1" in
        --json) JSON=1; shift ;;
        --quick) SIZES="85m"; CKPT_MODEL=(--layers 4 --channels 256 --heads 4); shift ;;
        --sizes) SIZES=$2; shift 2 ;;
        --zr) ZR=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "usage: $0 [--json] [--quick] [--sizes \"85m 302m\"] [--zr PATH] [--out FILE]" >&2
           exit 2 ;;
    esac
done
[ -x "$ZR" ] || { echo "run.sh: $ZR not found (make build)" >&2; exit 2; }

model_args() {
    case "$1" in
        85m) echo "--layers 12 --channels 768 --heads 12" ;;
        302m) echo "--layers 24 --channels 1024 --heads 16" ;;
        *) echo "run.sh: unknown size $1 (85m or 302m)" >&2; exit 2 ;;
    esac
}

ROWS=$(mktemp /tmp/zr-memory-rows.XXXXXX)
trap 'rm -f "$ROWS"' EXIT

# run LAYOUT NP RPN ARGS...: one launch; its JSON line (with the layout) goes to ROWS
run() {
    local layout=$1 np=$2 rpn=$3
    shift 3
    local env=()
    [ "$rpn" != "-" ] && env=(-x ZR_RANKS_PER_NODE="$rpn")
    local out
    if ! out=$(mpirun.openmpi -np "$np" "${env[@]}" "$ZR" bench memory --json "$@" 2>&1); then
        echo "run.sh: launch failed: W=$np $layout $*" >&2
        echo "$out" | tail -5 >&2
        exit 1
    fi
    echo "$out" | grep -v '^{' >&2
    echo "$out" | grep '^{' | tail -1 | sed "s/^{/{\"layout\": \"$layout\", /" >>"$ROWS"
}

printf '%-6s %-7s %9s %12s %12s %9s %12s\n' size layout params rss_MB formula_MB ratio state_MB >&2
for size in $SIZES; do
    read -r -a M <<<"$(model_args "$size")"
    for w in 1 2 4; do
        run "${w}x1" "$w" - "${M[@]}" --seq 64 --micro-batch 1 --steps 1
    done
    run "2x2" 4 2 "${M[@]}" --seq 64 --micro-batch 1 --steps 1
done
# activation checkpointing at T=1024: two steps, the second timed alone is not
# possible from outside, so both runs take 2 steps and report the mean
run "1x1" 1 - "${CKPT_MODEL[@]}" --seq 1024 --micro-batch 1 --steps 2
run "1x1" 1 - "${CKPT_MODEL[@]}" --seq 1024 --micro-batch 1 --steps 2 --checkpoint

SUMMARY=$(python3 - "$ROWS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
seq64 = [r for r in rows if r["seq"] == 64]
for r in seq64:
    print("%-6s %-7s %9d %12.1f %12.1f %9.3f %12.1f" % (
        "%.1fM" % (r["params"] / 1e6), r["layout"], r["params"], r["rss_peak_bytes"] / 1e6,
        r["formula_bytes"] / 1e6, r["rss_over_formula"], r["state_bytes"] / 1e6), file=sys.stderr)
plain = [r for r in rows if r["seq"] == 1024 and not r["checkpoint"]]
ck = [r for r in rows if r["seq"] == 1024 and r["checkpoint"]]
summary = {"bench": "memory", "rss_over_formula_max": max(r["rss_over_formula"] for r in rows),
           "runs": rows}
if plain and ck:
    p, c = plain[-1], ck[-1]
    summary["checkpointing"] = {
        "params": p["params"], "seq": p["seq"],
        "rss_plain_bytes": p["rss_peak_bytes"], "rss_checkpoint_bytes": c["rss_peak_bytes"],
        "rss_saved_bytes": p["rss_peak_bytes"] - c["rss_peak_bytes"],
        "activation_plain_bytes": p["activation_bytes"],
        "activation_checkpoint_bytes": c["activation_bytes"],
        "step_plain_s": p["step_s"], "step_checkpoint_s": c["step_s"],
        "time_added_ratio": c["step_s"] / p["step_s"] - 1.0}
    print("checkpointing at T=%d (%.1fM params, W=1): RSS %.1f -> %.1f MB, step %.2f -> %.2f s (+%.0f%%)" % (
        p["seq"], p["params"] / 1e6, p["rss_peak_bytes"] / 1e6, c["rss_peak_bytes"] / 1e6,
        p["step_s"], c["step_s"], 100 * summary["checkpointing"]["time_added_ratio"]), file=sys.stderr)
print("rss_over_formula_max %.3f" % summary["rss_over_formula_max"], file=sys.stderr)
print(json.dumps(summary))
EOF
) || exit 1
echo "$SUMMARY" >"$OUT"
if [ "$JSON" = 1 ]; then
    echo "$SUMMARY"
fi
