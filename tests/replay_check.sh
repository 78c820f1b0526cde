#!/bin/bash
# replay_check.sh - bench/cluster/replay.sh checked on a stored planner run and
# on a run made from it whose answers are known, run by test_cli (test_replay).
#
# 1. The stored run (results/plan_*-quick-8rounds) replays with this tree's zr:
#    every measured row priced, every cell planned (the stored probes stay
#    readable by zr plan, and zr plan's --json keeps what replay.sh reads).
# 2. A made-up run in a folder: each row measured at 1.25x this tree's price of
#    it and predicted, as run, at 0.9 of that price, every row at 1000 tokens/s
#    but the replayed pick's at 900. Its MAPE must be 0.2 (as run 0.28), every
#    cell's error -0.2, and the pick 0.9 of the best wherever it was measured.
#
# usage: ZR_BIN=zr tests/replay_check.sh WORKDIR; exit 0 pass, 1 fail.
set -euo pipefail
cd "$(dirname "$0")/.."
ZR=${ZR_BIN:?ZR_BIN: the zr to replay with}
W=${1:?usage: replay_check.sh WORKDIR}
RUN=-quick-8rounds
R=bench/cluster/results
REPLAY=(bench/cluster/replay.sh --zr "$ZR")
fail() { echo "replay_check: $*"; exit 1; }

"${REPLAY[@]}" --json "$RUN" >"$W/stored.json"
rows=$(wc -l <"$R/plan_rows$RUN.jsonl")
cells=$(wc -l <"$R/plan_probes$RUN.jsonl")
jq -e --argjson rows "$rows" --argjson cells "$cells" '
    .rows == $rows and (.cells | length) == $cells and .mape > 0 and .mape < 1
    and all(.cells[]; (.pick | length) > 0 and .mape >= 0)' "$W/stored.json" >/dev/null ||
    fail "the stored run $RUN: $(cat "$W/stored.json")"

"${REPLAY[@]}" --rows "$RUN" >"$W/priced.jsonl"
[ "$(wc -l <"$W/priced.jsonl")" = "$rows" ] || fail "--rows: not one line per row"
rm -rf "$W/made"
mkdir -p "$W/made"
cp "$R/plan_probes$RUN.jsonl" "$W/made/plan_probes.jsonl"
jq -c --slurpfile p "$W/priced.jsonl" --slurpfile s "$W/stored.json" '
    (.layout + " " + .rate) as $cell | .mode as $m
    | ($p | map(select(.cell == $cell and .mode == $m)))[0].pred_ms as $price
    | ($s[0].cells | map(select(.cell == $cell)))[0].pick as $pick
    | .step_ms = 1.25 * $price | .pred_step_ms = 0.9 * $price
    | .tokens_per_s = (if .config == $pick then 900 else 1000 end)' \
    "$R/plan_rows$RUN.jsonl" >"$W/made/plan_rows.jsonl"
measured=$(jq -n --slurpfile s "$W/stored.json" --slurpfile rows "$W/made/plan_rows.jsonl" '
    [$s[0].cells[] | .pick as $k | .cell as $c
     | select(any($rows[]; .layout + " " + .rate == $c and .config == $k))] | length')
"${REPLAY[@]}" --json "$W/made" >"$W/made.json"
jq -e --argjson measured "$measured" '
    def near($x): (. - $x | fabs) < 1e-9;
    (.mape | near(0.2)) and (.old_mape | near(0.28))
    and all(.cells[]; (.bias | near(-0.2)) and (.mape | near(0.2))
                      and (.pick_vs_best == null or (.pick_vs_best | near(0.9))))
    and ([.cells[] | select(.pick_vs_best != null)] | length) == $measured' \
    "$W/made.json" >/dev/null || fail "the made-up run: $(cat "$W/made.json")"
echo "replay_check: $rows rows of $cells cells replayed; the made-up run's MAPE 0.2 (0.28 as run)," \
    "the pick at 0.9 in $measured cells"
