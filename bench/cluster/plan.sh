# bench/cluster/plan.sh - sourced by bench/cluster/run.sh --plan (issue 15): the
# planner's predictions against measurements on the emulated cluster.
#
# For each layout (N nodes x D ranks) and link rate: `zr probe` under mpirun on
# the cluster, `zr plan --json --write-config` on its probe, then ROUNDS rounds
# of one launch of `zr bench train --json --modes M` per mode (ZeRO-3 bf16,
# +qwZ, +hpZ, +qgZ, full ZeRO++, and "config": the plan's pick, from the file
# it wrote), K steps each (median step, max over ranks; peak RSS = VmHWM, max
# over ranks, one mode per process). A mode's measurement is its median round
# (peak RSS: the largest round): on this shared 2-core machine one launch
# varies by +-15%, enough to reorder modes within a few percent of each other.
# Each measured mode is matched with the plan's row of the same
# configuration (stage 3, qwZ INT8, hpZ = D, qgZ INT4, the default prefetch
# budget, micro-batch 1). Summary keys:
#   plan_step_time_mape    mean over every cell and mode of |predicted - measured| / measured
#   plan_step_time_mape_unreferenced  the same without zero3_bf16, one of the configurations
#                          the probe ran as its reference steps (cost.c calibrates on them)
#   plan_step_time_err_median  the median of the same errors
#   plan_memory_max_err    largest |predicted peak - measured peak RSS| / measured
#   plan_pick_vs_best_min  smallest, over cells, of the pick's measured tokens/s over the best
#                          measured tokens/s of the cell (the modes and the pick; a configuration
#                          launched under two names, the pick and a mode, is measured once: the
#                          median of both names' rounds)
#   plan_pick_confirmed_min  the same from fresh rounds (plan_confirm): the pick against the
#                          fastest other mode of the first rounds, both launched again ROUNDS
#                          times, interleaved; 1 where the pick is the faster (or the same
#                          configuration). plan_confirm.jsonl holds those rounds per cell
# plan_probes.jsonl keeps every cell's probe with the results, for replay.sh.
# Uses K, ROUNDS, RATES, LAYOUTS, OUT, ZR, CLUSTER, MODEL, owned/cleanup and keep_results of run.sh.

PLAN_MODES="zero3_bf16 qwz hpz qgz zeropp config"
# a plan row's configuration as the rows name it (replay.sh matches on it)
PLAN_CONFIG_JQ='def config: "stage \(.stage) qwz \(.qwz)/\(.qwz_bits) hpz \(.hpz) qgz \(.qgz)/\(.qgz_bits) prefetch \(.prefetch_bucket) micro \(.micro_batch)x\(.accum)";'
# --max-seq-len 32: zr bench train's model (its position table is seq_len long)
PLAN_MODEL=(--layers 4 --channels 512 --heads 8 --seq-len 32 --max-seq-len 32 --micro-batch 1 --threads 1)

# plan_row MODE D -> the jq filter selecting the plan's row for that mode
plan_row() {
    local q=0 h=1 g=0
    case $1 in
        config) echo '.configs[0]'; return ;;
        qwz) q=1 ;;
        hpz) h=$2 ;;
        qgz) g=1 ;;
        zeropp) q=1; h=$2; g=1 ;;
    esac
    case $1 in
        # zr bench train asks for hpZ with zero_hpz_partition_size 0: with one rank per node
        # that is a secondary over a group of one, the plan's hpz 0
        hpz|zeropp) [ "$2" = 1 ] && h=0 ;;
    esac
    echo "[.configs[] | select(.stage == 3 and .qwz == $q and (.qwz == 0 or .qwz_bits == 8)
        and .hpz == $h and .qgz == $g and (.qgz == 0 or .qgz_bits == 4)
        and .prefetch_bucket == 50000000 and .micro_batch == 1 and .accum == 1)][0]"
}

# plan_launch TAG N D MODE NAME ROUND FILE: one launch of MODE on the cluster, its line appended
plan_launch() {
    local tag=$1 n=$2 d=$3 mode=$4 name=$5 round=$6 file=$7
    local log="$OUT/logs/$tag-$mode-$name.log"
    "$CLUSTER" exec --slots "$d" --timeout 300 -- mpirun.openmpi -np $((n * d)) "$ZR" \
        bench train --json --steps "$K" --modes "$mode" --config "$OUT/pick-$tag.json" \
        "${MODEL[@]}" >"$log" 2>&1 ||
        { echo "run.sh: launch failed ($tag $mode): see $log" >&2; tail -5 "$log" >&2; return 1; }
    tail -n 1 "$log" | jq -c --arg mode "$mode" --argjson round "$round" \
        '{mode: $mode, round: $round, steps: .steps, ranks: .ranks, m: .modes[$mode]}' \
        >>"$file" || { echo "run.sh: no JSON in $log" >&2; return 1; }
}

# plan_noise CELL: the machine's own steadiness just before the cell's launches (zr bench noise:
# a fixed loop per core, no zr, no MPI), one line of plan_noise.jsonl
plan_noise() {
    local line
    line=$("$ZR" bench noise --seconds 10 --json 2>/dev/null | tail -n 1) &&
        jq -c --arg cell "$1" '{cell: $cell, fast_piece_ms} + .all' <<<"$line" \
            >>"$OUT/plan_noise.jsonl" ||
        { echo "run.sh: zr bench noise failed" >&2; return 1; }
}

# plan_confirm TAG N D MEAS: the pick against the fastest other mode of the rounds, measured
# again in ROUNDS fresh rounds of the two, interleaved. The fastest of six modes measured
# once each is also the one whose noise ran luckiest (on this machine a launch varies by
# ~15%), so the pick's ratio to it is biased low; fresh rounds of both, chosen before they
# ran, are not. Skipped when the fastest other mode is the pick's own configuration.
plan_confirm() {
    local tag=$1 n=$2 d=$3 meas=$4 rival round
    rival=$(jq -s -r --slurpfile plan "$OUT/plan-$tag.json" '
        def med: sort_by(.m.step_ms) | .[length / 2 | floor];
        map(select(.mode != "config")) | group_by(.mode) | map(med) | min_by(.m.step_ms) | .mode' \
        "$meas") || return 1
    local file="$OUT/confirm-$tag.jsonl" cell="${tag%%-*} ${tag#*-}"
    : >"$file" || return 1
    if [ "$(plan_same "$tag" "$rival" "$d")" = true ]; then
        echo "  confirm: the fastest other mode ($rival) is the pick's configuration" >&2
        jq -n -c --arg cell "$cell" --arg rival "$rival" \
            '{cell: $cell, rival: $rival, same: true}' >>"$OUT/plan_confirm.jsonl"
        return
    fi
    for round in $(seq "$ROUNDS"); do
        for mode in config "$rival"; do
            plan_launch "$tag" "$n" "$d" "$mode" "c$round" "$round" "$file" || return 1
        done
    done
    jq -s -c --arg cell "$cell" --arg rival "$rival" '
        def med: sort_by(.m.step_ms) | .[length / 2 | floor];
        (map(select(.mode == "config")) | med) as $p | (map(select(.mode != "config")) | med) as $r
        | {cell: $cell, rival: $rival, same: false, pick_tokens_per_s: $p.m.tokens_per_s,
           rival_tokens_per_s: $r.m.tokens_per_s,
           pick_round_step_ms: (map(select(.mode == "config")) | map(.m.step_ms)),
           rival_round_step_ms: (map(select(.mode != "config")) | map(.m.step_ms))}' "$file" \
        >>"$OUT/plan_confirm.jsonl" || return 1
    tail -n 1 "$OUT/plan_confirm.jsonl" | jq -r '"  confirm: pick \(.pick_tokens_per_s | round) tokens/s, \(.rival) \(.rival_tokens_per_s | round)"' >&2
}

# plan_same TAG MODE D -> true where the plan's row for MODE is its pick (configs[0])
plan_same() {
    jq -r '('"$(plan_row "$2" "$3")"') as $r | .configs[0] as $c
        | ($r != null and ($r | del(.rank)) == ($c | del(.rank)))' "$OUT/plan-$1.json"
}

run_plan() {
    local rows="$OUT/plan_rows.jsonl" t0=$SECONDS layout n d rate tag mode
    : >"$rows" || return 1
    : >"$OUT/plan_confirm.jsonl" || return 1
    : >"$OUT/plan_probes.jsonl" || return 1
    : >"$OUT/plan_noise.jsonl" || return 1
    for layout in $LAYOUTS; do
        n=${layout%x*}
        d=${layout#*x}
        "$CLUSTER" up "$n" "${RATES%% *}"
        local rc=$?
        [ $rc = 0 ] || return $rc # 77: skipped (message printed), 75: busy
        owned=1
        for rate in $RATES; do
            "$CLUSTER" rate "$n" "$rate" || return 1
            tag=$layout-$rate
            "$CLUSTER" exec --slots "$d" --timeout 300 -- mpirun.openmpi -np $((n * d)) "$ZR" \
                probe "${PLAN_MODEL[@]}" -o "$OUT/probe-$tag.json" >"$OUT/logs/$tag-probe.log" 2>&1 ||
                { echo "run.sh: zr probe failed: see $OUT/logs/$tag-probe.log" >&2; return 1; }
            "$ZR" plan "${PLAN_MODEL[@]}" --probe "$OUT/probe-$tag.json" --json \
                --write-config "$OUT/pick-$tag.json" >"$OUT/plan-$tag.json" 2>"$OUT/logs/$tag-plan.log" ||
                { echo "run.sh: zr plan failed: see $OUT/logs/$tag-plan.log" >&2; return 1; }
            echo "$tag: plan picks $(jq -r .why "$OUT/plan-$tag.json" | cut -d: -f1)" >&2
            # the probe kept with the results: replay.sh prices the measured rows again with
            # another version of the cost model, without the machine's noise of a new run
            jq -c --arg cell "$layout $rate" '{cell: $cell, probe: .}' "$OUT/probe-$tag.json" \
                >>"$OUT/plan_probes.jsonl" || return 1
            # R rounds, every mode once per round: a drift of this shared machine during the
            # cell falls on every mode alike, and the median round of each mode is kept
            local meas="$OUT/meas-$tag.jsonl" round
            : >"$meas" || return 1
            plan_noise "$layout $rate" || return 1
            for round in $(seq "$ROUNDS"); do
                for mode in $PLAN_MODES; do
                    plan_launch "$tag" "$n" "$d" "$mode" "r$round" "$round" "$meas" || return 1
                done
            done
            plan_confirm "$tag" "$n" "$d" "$meas" || return 1
            for mode in $PLAN_MODES; do
                jq -s -c --arg layout "$layout" --arg rate "$rate" --arg mode "$mode" \
                    --slurpfile plan "$OUT/plan-$tag.json" "$PLAN_CONFIG_JQ"'
                    map(select(.mode == $mode)) | sort_by(.m.step_ms) as $r
                    | $r[($r | length) / 2 | floor] as $med
                    | $med.m as $m | ($r | map(.m.rss_peak_bytes) | max) as $rss
                    | ($plan[0] | '"$(plan_row "$mode" "$d")"') as $p
                    | {layout: $layout, rate: $rate, mode: $mode, steps: $med.steps,
                       rounds: ($r | length), round_step_ms: ($r | map(.m.step_ms)),
                       step_ms: $m.step_ms, min_step_ms: $m.min_step_ms, tokens_per_s: $m.tokens_per_s,
                       compute_ms: $m.compute_ms, comm_ms: $m.comm_ms, optim_ms: $m.optim_ms,
                       rss_bytes: $rss, inter_bytes: $m.inter_bytes,
                       pred_step_ms: $p.step_ms, pred_tokens_per_s: $p.tokens_per_s,
                       pred_compute_ms: $p.compute_ms, pred_codec_ms: $p.codec_ms,
                       pred_exposed_ms: $p.exposed_ms, pred_comm_ms: $p.comm_ms,
                       pred_memory_bytes: $p.memory_bytes, pred_inter_bytes: ($p.inter_bytes * $med.ranks),
                       config: ($p | config),
                       step_err: (($p.step_ms - $m.step_ms) / $m.step_ms),
                       mem_err: (($p.memory_bytes - $rss) / $rss)}' "$meas" \
                    >>"$rows" || { echo "run.sh: cannot summarize $meas" >&2; return 1; }
                jq -r 'select(.layout == "'"$layout"'" and .rate == "'"$rate"'" and .mode == "'"$mode"'")
                    | "  \(.mode): measured \(.step_ms|floor) ms (rounds \(.round_step_ms | map(floor) | join(" "))), predicted \(.pred_step_ms|floor) ms (\(.step_err*1000|round/10)%); rss \(.rss_bytes/1e6|floor) MB, predicted \(.pred_memory_bytes/1e6|floor) MB (\(.mem_err*1000|round/10)%)"' "$rows" >&2
            done
        done
        cleanup
    done
    plan_report "$rows" $((SECONDS - t0))
}

plan_report() {
    local rows=$1 secs=$2
    jq -s --argjson secs "$secs" --arg model "${MODEL[*]}" \
        --slurpfile confirm "$OUT/plan_confirm.jsonl" --slurpfile noise "$OUT/plan_noise.jsonl" '
        def mean: if length == 0 then null else add / length end;
        def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
            else (.[length / 2 - 1] + .[length / 2]) / 2 end;
        . as $rows
        | ($rows | map(.step_err | fabs)) as $e
        | ($rows | map(.mem_err | fabs)) as $m
        | ($rows | group_by(.layout + " " + .rate) | map(
            # a configuration launched under two names (the pick is often one of the modes) is
            # one configuration: its rounds pooled, their median its measurement
            (.[0].tokens_per_s * .[0].step_ms) as $tokms
            | (group_by(.config) | map({config: .[0].config,
                                        tokens_per_s: ($tokms / ([.[].round_step_ms[]] | median))}))
              as $byconf
            | (map(select(.mode == "config"))[0].config) as $pc
            | {cell: (.[0].layout + " " + .[0].rate), pick_config: $pc,
               pick: ($byconf | map(select(.config == $pc)))[0],
               best: ($byconf | map(.tokens_per_s) | max)}
            | .cell as $c | ($confirm | map(select(.cell == $c)))[0] as $k
            | ($noise | map(select(.cell == $c)))[0] as $z
            | {cell, pick_config, pick_tokens_per_s: .pick.tokens_per_s,
               best_tokens_per_s: .best, pick_vs_best: (.pick.tokens_per_s / .best),
               rival: $k.rival,
               pick_vs_rival_confirmed: (if $k == null then null elif $k.same then 1
                   else ([$k.pick_tokens_per_s / $k.rival_tokens_per_s, 1] | min) end),
               confirm: $k, noise: ($z // null | if . then del(.cell) else . end)})) as $cells
        | {bench: "cluster_plan", model: $model, seconds: $secs,
           plan_step_time_mape: ($e | mean),
           plan_step_time_mape_unreferenced: ($rows | map(select(.mode != "zero3_bf16")
                                                      | .step_err | fabs) | mean),
           plan_step_time_err_median: ($e | median), plan_step_time_err_max: ($e | max),
           plan_memory_max_err: ($m | max), plan_memory_err_median: ($m | median),
           plan_pick_vs_best_min: ($cells | map(.pick_vs_best) | min),
           plan_pick_confirmed_min: ($cells | map(.pick_vs_rival_confirmed)
                                     | if any(. == null) then null else min end),
           machine_noise_mean_over_fast: ($cells | map(.noise.mean_over_fast // empty) | mean),
           machine_noise_worst_window: ($cells | map(.noise.worst_window // empty) | max),
           cells: $cells, rows: $rows}' "$rows" >"$OUT/plan_summary.json" || return 1
    {
        echo "# zr plan: predicted vs measured on the emulated cluster"
        echo
        echo "zr bench train ${MODEL[*]}, $K steps per launch, $ROUNDS rounds of one launch per mode (the median round kept); $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores."
        echo "Predicted: zr plan on a zr probe of the same cell. Memory: predicted peak per rank vs VmHWM (max over ranks)."
        [ -n "${ZR_CPU:-}${OPENBLAS_CORETYPE:-}" ] &&
            echo "Kernels capped: ZR_CPU=${ZR_CPU:-native}, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-auto}."
        echo
        echo "| layout | link | mode | configuration | step ms measured | predicted | error | tokens/s | RSS MB | predicted MB | error |"
        echo "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
        jq -r '"| \(.layout) | \(.rate) | \(.mode) | \(.config) | \(.step_ms * 10 | round / 10) | \(.pred_step_ms * 10 | round / 10) | \(.step_err * 1000 | round / 10)% | \(.tokens_per_s | round) | \(.rss_bytes / 1e5 | round / 10) | \(.pred_memory_bytes / 1e5 | round / 10) | \(.mem_err * 1000 | round / 10)% |"' "$rows"
        echo
        jq -r '.cells[] | "- \(.cell): pick = \(.pick_config), measured \(.pick_tokens_per_s | round) tokens/s = \(.pick_vs_best * 1000 | round / 1000) of the best measured (\(.best_tokens_per_s | round)); " + (if .confirm == null then "not confirmed" elif .confirm.same then "the fastest other mode, \(.rival), is the same configuration" else "confirmed against \(.rival) in fresh rounds: \(.confirm.pick_tokens_per_s | round) vs \(.confirm.rival_tokens_per_s | round) tokens/s = \(.pick_vs_rival_confirmed * 1000 | round / 1000)" end) + (if .noise == null then "" else "; the machine just before (zr bench noise, 10 s): a fixed loop at \(.noise.mean_over_fast * 100 | round / 100)x its fast time (\(.noise.fast_piece_ms * 1000 | round / 1000) ms) on average, \(.noise.slow_share * 100 | round)% of its time 1.2x or slower, worst second \(.noise.worst_window * 100 | round / 100)x" end)' "$OUT/plan_summary.json"
        echo
        jq -r '"plan_step_time_mape = \(.plan_step_time_mape * 1000 | round / 1000) (without the reference zero3_bf16: \(.plan_step_time_mape_unreferenced * 1000 | round / 1000); median \(.plan_step_time_err_median * 1000 | round / 1000)), plan_memory_max_err = \(.plan_memory_max_err * 1000 | round / 1000), plan_pick_vs_best_min = \(.plan_pick_vs_best_min * 1000 | round / 1000), confirmed \(if .plan_pick_confirmed_min == null then "-" else (.plan_pick_confirmed_min * 1000 | round / 1000) end); benchmark time \(.seconds) s." + (if .machine_noise_worst_window == null then "" else " The machine itself (zr bench noise before each cell): a fixed loop at \(.machine_noise_mean_over_fast * 100 | round / 100)x its fast time on average, worst second \(.machine_noise_worst_window * 100 | round / 100)x." end)' "$OUT/plan_summary.json"
    } >"$OUT/plan_results.md"
    keep_results "$OUT/plan_results.md" "$OUT/plan_summary.json" "$OUT/plan_rows.jsonl" \
        "$OUT/plan_confirm.jsonl" "$OUT/plan_probes.jsonl"
    cat "$OUT/plan_results.md" >&2
    jq -c 'del(.rows)' "$OUT/plan_summary.json"
}
