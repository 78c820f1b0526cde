#!/bin/bash
# bench/cluster/run.sh - ZeRO++ against ZeRO-3 on an emulated low-bandwidth
# cluster (scripts/cluster.sh): wall-clock throughput and the bytes that really
# cross the node links, per mode, layout and link rate (issue 8).
#
# usage: bench/cluster/run.sh [--quick] [--steps K] [--rates "1gbit 10gbit none"]
#                             [--layouts "4x1 2x2"] [--out DIR] [--zr PATH]
#        bench/cluster/run.sh --report DIR    (tables and chart again from DIR/rows.jsonl)
#        bench/cluster/run.sh --plan [--steps K] [--rounds R] [--rates ...] [--layouts ...]
#                                             (zr probe + zr plan vs measured, issue 15;
#                                             R rounds of every mode, default 3)
# (~7 minutes with the defaults, ~2.5 with --quick)
#
# For each layout (N nodes x D ranks) one cluster is brought up, and for each
# rate its links are reshaped; each mode (ZeRO-3 bf16, +qwZ, +hpZ, +qgZ, full
# ZeRO++) is launched on its own twice, with S1 and K steps ("zr bench train
# --modes X --json"), reading the eth0 byte counters of every node before and
# after each launch. Link bytes per step = (bytes of the K-step launch - bytes
# of the S1-step launch) / (K - S1): mpirun/oob start-up and teardown, model
# set-up and the warm-up step are the same in both launches and cancel, so
# nothing is subtracted by estimate. That figure (tx summed over nodes; it
# includes TCP/IP/Ethernet headers, TCP ACKs and MPI's own headers) stands next
# to zr's exact inter-node counter per step (the payload zr hands to MPI,
# summed over ranks). Step times, tokens/s, compute/comm split and loss are
# those of the K-step launch (median and min over K steps, max over ranks).
#
# Model: GPT L=4 C=512 (12.8 M parameters) with T=32, B=1 per rank: a
# ZeRO-3 step moves 153 MB (2x2) or 230 MB (4x1) across the links, summed over
# ranks, i.e. 0.5-0.6 s per step at 1 Gbit/s per node link, against ~0.13-0.2 s
# of compute when the links are unshaped: the baseline is link-bound at
# 1 Gbit/s. At such a small T*B the forward/backward matmuls are bound by
# reading the weights, so compute, like communication, grows with the
# parameter count: measured on 4x1 unshaped, compute per step is 127 / 126 /
# 156 ms at T = 8 / 16 / 32 (ZeRO-3), so a smaller T buys almost nothing and a
# larger model only makes the run longer. T=32 keeps tokens/s meaningful.
# K defaults to 16 steps (--quick: 4) because this 2-core machine is shared.
#
# Output: DIR (default results/cluster/<timestamp>/) holds every launch's log,
# rows.jsonl (one measurement per line), results.md, throughput.png and
# summary.json; the same files (without logs) are copied to
# bench/cluster/results/. The summary JSON is also the last line of stdout.
# Exit 77 when the cluster cannot be built here (not root, no namespaces).
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD

K=16
S1=2
RATES="1gbit 10gbit none"
LAYOUTS="4x1 2x2"
OUT=""
ZR="$ROOT/build/release/zr"
MODEL=(--layers 4 --channels 512 --heads 8 --seq 32 --micro-batch 1)
MODES="zero3_bf16 qwz hpz qgz zeropp"
HEADLINE=4x1
REPORT_ONLY=0
PLAN=0
ROUNDS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) K=4; S1=2; shift ;;
        --plan) PLAN=1; shift ;;
        --steps) K=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --rates) RATES=$2; shift 2 ;;
        --layouts) LAYOUTS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --zr) ZR=$(realpath "$2"); shift 2 ;;
        --report) OUT=$2; REPORT_ONLY=1; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case "$ROUNDS" in ''|*[!0-9]*|0) echo "run.sh: --rounds must be a positive integer" >&2; exit 2 ;; esac
[ "$K" -gt "$S1" ] || { echo "run.sh: --steps must be > $S1" >&2; exit 2; }
[ -x "$ZR" ] || { echo "run.sh: $ZR not built (make)" >&2; exit 1; }
command -v jq >/dev/null || { echo "run.sh: needs jq (scripts/setup.sh)" >&2; exit 1; }
CLUSTER="$ROOT/scripts/cluster.sh"
[ $PLAN = 1 ] && DEFAULT_OUT=results/cluster-plan || DEFAULT_OUT=results/cluster
OUT=${OUT:-$DEFAULT_OUT/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/logs" || exit 1
ROWS="$OUT/rows.jsonl"
if [ $REPORT_ONLY = 1 ]; then
    [ -s "$ROWS" ] || { echo "run.sh: no $ROWS" >&2; exit 1; }
    LAYOUTS=$(jq -r .layout "$ROWS" | awk '!s[$0]++' | tr '\n' ' ')
    RATES=$(jq -r .rate "$ROWS" | awk '!s[$0]++' | tr '\n' ' ')
    K=$(jq -s '.[0].steps // 0' "$ROWS"); S1=$(jq -s '.[0].short_steps // 0' "$ROWS")
else
    : >"$ROWS"
fi
# only a run over every layout and link rate replaces the committed bench/cluster/results/
# shellcheck disable=SC2086
FULL=0; [ "$(echo $LAYOUTS $RATES)" = "4x1 2x2 1gbit 10gbit none" ] && FULL=1
keep_results() {
    if [ $FULL = 1 ]; then
        mkdir -p bench/cluster/results && cp "$@" bench/cluster/results/
    else
        echo "run.sh: a subset of the layouts or rates: bench/cluster/results/ left as it was" >&2
    fi
}

owned=0
cleanup() {
    if [ $owned = 1 ]; then
        "$CLUSTER" down || echo "run.sh: cluster teardown failed: check 'ip netns list'" >&2
        owned=0
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ $PLAN = 1 ]; then
    . "$ROOT/bench/cluster/plan.sh" # run_plan: zr probe + zr plan against the measured modes
    run_plan
    exit $?
fi

# Sums over all nodes' eth0: tx bytes, rx bytes, tx packets (mawk: %d would
# saturate at 2^31, hence %.0f).
link_bytes() {
    "$CLUSTER" counters | awk '{ tx += $2; rx += $3; tp += $4 } END { printf "%.0f %.0f %.0f\n", tx, rx, tp }'
}

# launch N D MODE STEPS LOG -> prints "tx rx txpackets" of the launch; the
# bench's output goes to LOG. Fails when the launch fails or prints no JSON.
launch() {
    local n=$1 d=$2 mode=$3 steps=$4 log=$5 b0 b1
    b0=$(link_bytes) || return 1
    "$CLUSTER" exec --slots "$d" --timeout 300 -- mpirun.openmpi -np $((n * d)) "$ZR" bench train \
        --json --steps "$steps" --modes "$mode" "${MODEL[@]}" >"$log" 2>&1 || {
        echo "run.sh: launch failed ($mode, $steps steps): see $log" >&2; tail -5 "$log" >&2; return 1; }
    b1=$(link_bytes) || return 1
    tail -n 1 "$log" | jq -e .modes >/dev/null 2>&1 || { echo "run.sh: no JSON in $log" >&2; return 1; }
    echo "$b0 $b1" | awk '{ printf "%.0f %.0f %.0f\n", $4 - $1, $5 - $2, $6 - $3 }'
}

t_start=$SECONDS
[ $REPORT_ONLY = 1 ] && LOOP="" || LOOP=$LAYOUTS
for layout in $LOOP; do
    n=${layout%x*}
    d=${layout#*x}
    first_rate=${RATES%% *}
    "$CLUSTER" up "$n" "$first_rate"
    rc=$?
    [ $rc = 0 ] || exit $rc # 77: skipped (message printed), 75: busy
    owned=1
    for rate in $RATES; do
        "$CLUSTER" rate "$n" "$rate" || exit 1
        for mode in $MODES; do
            tag="$layout-$rate-$mode"
            read -r txa rxa pka < <(launch "$n" "$d" "$mode" "$S1" "$OUT/logs/$tag-s$S1.log") || exit 1
            [ -n "${txa:-}" ] || exit 1
            read -r txb rxb pkb < <(launch "$n" "$d" "$mode" "$K" "$OUT/logs/$tag-s$K.log") || exit 1
            [ -n "${txb:-}" ] || exit 1
            tail -n 1 "$OUT/logs/$tag-s$K.log" | jq -c --arg layout "$layout" --arg rate "$rate" \
                --arg mode "$mode" --argjson k "$K" --argjson s1 "$S1" \
                --argjson txa "$txa" --argjson rxa "$rxa" --argjson txb "$txb" --argjson rxb "$rxb" \
                --argjson pka "$pka" --argjson pkb "$pkb" '
                .modes[$mode] as $m
                | (($txb - $txa) / ($k - $s1)) as $tx
                | {layout: $layout, rate: $rate, mode: $mode, nodes: .nodes, ranks: .ranks,
                   steps: $k, short_steps: $s1,
                   step_ms: $m.step_ms, min_step_ms: $m.min_step_ms, tokens_per_s: $m.tokens_per_s,
                   compute_ms: $m.compute_ms, comm_ms: $m.comm_ms, optim_ms: $m.optim_ms,
                   mean_loss: $m.mean_loss, zr_inter_bytes: $m.inter_bytes,
                   zr_intra_bytes: $m.intra_bytes, link_tx_bytes: $tx,
                   link_rx_bytes: (($rxb - $rxa) / ($k - $s1)),
                   link_tx_packets: (($pkb - $pka) / ($k - $s1)),
                   link_over_zr: (if $m.inter_bytes > 0 then $tx / $m.inter_bytes else null end),
                   fixed_link_bytes: ($txa - $s1 * $tx),
                   launch_tx_bytes: {short: $txa, long: $txb}}' >>"$ROWS" || exit 1
            jq -r 'select(.layout == "'"$layout"'" and .rate == "'"$rate"'" and .mode == "'"$mode"'")
                | "\(.layout) \(.rate) \(.mode): \(.step_ms|floor) ms/step (min \(.min_step_ms|floor)), \(.tokens_per_s|floor) tok/s, link \(.link_tx_bytes/1e6*1000|floor/1000) MB/step, zr \(.zr_inter_bytes/1e6*1000|floor/1000) MB/step"' "$ROWS" >&2
        done
    done
    cleanup
done

# --- report -------------------------------------------------------------------
secs=$((SECONDS - t_start))
[ $REPORT_ONLY = 1 ] && secs=$(jq '.seconds // 0' "$OUT/summary.json" 2>/dev/null || echo 0)
# f(n): a number with n decimals as text ("-" for null); jq has no printf.
JQ_FMT='def f(n): if . == null then "-" elif n == 0 then (round | tostring)
    else ((. * pow(10; n)) | round | tostring) as $s
    | (n + 1 - ($s | length)) as $pad | (if $pad > 0 then "0" * $pad else "" end) + $s
    | .[0:length - n] + "." + .[length - n:] end; '
jq -s --arg headline "$HEADLINE" --argjson k "$K" --argjson s1 "$S1" \
    --arg model "${MODEL[*]}" --argjson secs "$secs" '
    . as $rows
    | def get($l; $r; $m): $rows | map(select(.layout == $l and .rate == $r and .mode == $m))[0];
      def ratio(a; b): if a == null or b == null or b == 0 then null else a / b end;
      ($rows | map(.layout) | unique) as $layouts
    | ($layouts | map({key: ., value: ratio(get(.; "1gbit"; "zeropp").tokens_per_s;
                                            get(.; "1gbit"; "zero3_bf16").tokens_per_s)}) | from_entries) as $sp
    | ($layouts | map({key: ., value: ratio(get(.; "1gbit"; "zeropp").link_tx_bytes;
                                            get(.; "1gbit"; "zero3_bf16").link_tx_bytes)}) | from_entries) as $lr
    | ($layouts | map({key: ., value: ratio(get(.; "1gbit"; "zero3_bf16").min_step_ms;
                                            get(.; "1gbit"; "zeropp").min_step_ms)}) | from_entries) as $spmin
    | ($headline | if $sp[.] == null then $layouts[0] else . end) as $h
    | ($rows | map(.link_over_zr) | map(select(. != null))) as $agree
    | {bench: "cluster", headline_layout: $h, model: $model, steps: $k, short_steps: $s1,
       speedup_zeropp_1gbit: $sp[$h], link_bytes_ratio_1gbit: $lr[$h],
       speedup_zeropp_1gbit_by_layout: $sp, speedup_zeropp_1gbit_min_step_by_layout: $spmin,
       link_bytes_ratio_1gbit_by_layout: $lr,
       link_over_zr_min: ($agree | min), link_over_zr_max: ($agree | max),
       counters_agree_10pct: ($agree | length > 0 and all(. >= 0.9 and . <= 1.1)),
       seconds: $secs, rows: $rows}' "$ROWS" >"$OUT/summary.json" || exit 1

{
    echo "# ZeRO++ vs ZeRO-3 on the emulated cluster"
    echo
    echo "zr bench train ${MODEL[*]}; $K steps per launch (median / min step, max over ranks);"
    echo "link MB/step = eth0 tx bytes summed over nodes, (launch of $K steps - launch of $S1 steps) / $((K - S1));"
    echo "zr MB/step = zr's exact inter-node counter per step summed over ranks. $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores."
    echo
    echo "| layout | link | mode | step ms (median) | min ms | tokens/s | vs ZeRO-3 | compute ms | comm ms | link MB/step | link pkts/step | zr inter MB/step | link / zr | zr intra MB/step | mean loss |"
    echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    jq -r -s "$JQ_FMT"'
        . as $all | .[] | . as $x
        | ($all | map(select(.layout == $x.layout and .rate == $x.rate and .mode == "zero3_bf16"))[0].tokens_per_s) as $base
        | "| \(.layout) | \(.rate) | \(.mode) | \(.step_ms | f(1)) | \(.min_step_ms | f(1)) | \(.tokens_per_s | f(0)) | \(if $base then .tokens_per_s / $base | f(2) else null | f(0) end)x | \(.compute_ms | f(1)) | \(.comm_ms | f(1)) | \(.link_tx_bytes / 1e6 | f(3)) | \(.link_tx_packets // null | f(0)) | \(.zr_inter_bytes / 1e6 | f(3)) | \(.link_over_zr | f(4)) | \(.zr_intra_bytes / 1e6 | f(3)) | \(.mean_loss | f(4)) |"' "$ROWS"
    echo
    jq -r "$JQ_FMT"'"Headline (\(.headline_layout)): speedup_zeropp_1gbit = \(.speedup_zeropp_1gbit | f(2)), link_bytes_ratio_1gbit = \(.link_bytes_ratio_1gbit | f(3)). By layout at 1 Gbit/s: speedup (median step) " + (.speedup_zeropp_1gbit_by_layout | to_entries | map("\(.key) \(.value | f(2))") | join(", ")) + "; speedup (min step) " + (.speedup_zeropp_1gbit_min_step_by_layout | to_entries | map("\(.key) \(.value | f(2))") | join(", ")) + "; link bytes ratio " + (.link_bytes_ratio_1gbit_by_layout | to_entries | map("\(.key) \(.value | f(3))") | join(", ")) + ". Link / zr counters over all rows: \(.link_over_zr_min | f(4)) .. \(.link_over_zr_max | f(4)). Benchmark time \(.seconds) s."' "$OUT/summary.json"
} >"$OUT/results.md"

# chart: tokens/s per mode per link rate, one panel per layout
if command -v gnuplot >/dev/null; then
    nl=0
    for layout in $LAYOUTS; do
        {
            echo "rate $MODES"
            for rate in $RATES; do
                printf '%s' "$rate"
                for mode in $MODES; do
                    printf ' %s' "$(jq -r "select(.layout == \"$layout\" and .rate == \"$rate\" and .mode == \"$mode\") | .tokens_per_s" "$ROWS")"
                done
                echo
            done
        } >"$OUT/plot-$layout.dat"
        nl=$((nl + 1))
    done
    {
        echo "set terminal pngcairo size $((560 * nl)),420 noenhanced" 2>/dev/null
        echo "set output '$OUT/throughput.png'"
        echo "set multiplot layout 1,$nl title 'zr: ZeRO++ vs ZeRO-3 on the emulated cluster (tokens/s, median step)'"
        echo "set style data histograms; set style histogram clustered gap 1; set style fill solid 0.8 border -1"
        echo "set ylabel 'tokens/s'; set xlabel 'link rate'; set grid ytics; set key top left; set yrange [0:*]"
        for layout in $LAYOUTS; do
            n=${layout%x*}; d=${layout#*x}
            echo "set title '$layout: $n node(s) x $d rank(s) per node'"
            printf "plot '%s' using 2:xtic(1) title columnheader(2)" "$OUT/plot-$layout.dat"
            i=3
            for _ in $(echo "$MODES" | cut -d' ' -f2-); do printf ", '' using %d title columnheader(%d)" $i $i; i=$((i + 1)); done
            echo
        done
        echo "unset multiplot"
    } >"$OUT/plot.gp"
    gnuplot -e "set terminal pngcairo" >/dev/null 2>&1 || sed -i 's/pngcairo/png/' "$OUT/plot.gp"
    gnuplot "$OUT/plot.gp" || echo "run.sh: gnuplot failed (chart skipped)" >&2
fi

keep_results "$OUT/results.md" "$OUT/summary.json" "$OUT/rows.jsonl"
[ -f "$OUT/throughput.png" ] && keep_results "$OUT/throughput.png"
cat "$OUT/results.md" >&2
jq -c 'del(.rows)' "$OUT/summary.json"
