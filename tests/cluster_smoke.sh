#!/bin/bash
# cluster_smoke.sh - smoke test of zr on the emulated cluster (scripts/cluster.sh):
# 2 nodes x 2 ranks at 1 Gbit/s, a tiny GPT, ZeRO-3 bf16 and full ZeRO++.
#
# Checks that both modes run across real (namespace) nodes, that zr's exact
# inter-node counter per step agrees with the bytes the nodes' eth0 sent per
# step within 10% (per-step difference of a 2-step and a 6-step launch, so
# start-up traffic cancels), and that ZeRO++ sends fewer link bytes than
# ZeRO-3. Exit 0 pass, 1 fail, 77 skipped (not root, no network namespaces,
# or another cluster run holds the namespaces for over a minute). ~5 s.
set -u
cd "$(dirname "$0")/.."
CLUSTER="$PWD/scripts/cluster.sh"
ZR="${ZR_BIN:-$PWD/build/release/zr}" # test_cluster passes the zr of its build
MODEL=(--layers 2 --channels 128 --heads 4 --seq 16 --micro-batch 1)
S1=2
S2=6

[ -x "$ZR" ] || { echo "cluster_smoke: $ZR is not built (make)"; exit 1; }
command -v jq >/dev/null || { echo "cluster_smoke: skipped: jq is not installed"; exit 77; }
for _ in $(seq 12); do
    "$CLUSTER" up 2 1gbit
    rc=$?
    [ $rc = 75 ] || break
    sleep 5
done
case $rc in
    0) ;;
    77|75) echo "cluster_smoke: skipped: emulated cluster unavailable (cluster.sh exit $rc)"; exit 77 ;;
    *) echo "cluster_smoke: cluster.sh up failed ($rc)"; exit 1 ;;
esac
trap '"$CLUSTER" down' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tx_total() { "$CLUSTER" counters | awk '{ s += $2 } END { printf "%.0f\n", s }'; }

# run MODE STEPS -> "link_tx_bytes zr_inter_bytes_per_step" for the launch
run() {
    local t0 t1 out
    t0=$(tx_total) || return 1
    out=$("$CLUSTER" exec --slots 2 --timeout 120 -- mpirun.openmpi -np 4 "$ZR" bench train \
          --json --steps "$2" --modes "$1" "${MODEL[@]}" 2>&1) || { echo "$out" | tail -5 >&2; return 1; }
    t1=$(tx_total) || return 1
    echo "$out" | tail -n 1 | jq -e --arg m "$1" --argjson d $((t1 - t0)) '"\($d) \(.modes[$m].inter_bytes)"' -r ||
        { echo "$out" | tail -5 >&2; return 1; }
}

fail=0
declare -A link zr
for mode in zero3_bf16 zeropp; do
    read -r a za < <(run "$mode" $S1) && read -r b zb < <(run "$mode" $S2) || {
        echo "cluster_smoke: FAIL: $mode did not run"; exit 1; }
    link[$mode]=$(awk -v a="$a" -v b="$b" -v n=$((S2 - S1)) 'BEGIN { printf "%.0f", (b - a) / n }')
    zr[$mode]=$zb
    ok=$(awk -v l="${link[$mode]}" -v z="$zb" 'BEGIN { print ((z > 0 && l / z >= 0.9 && l / z <= 1.1) ? 1 : 0) }')
    printf 'cluster_smoke: %-10s link %10d B/step  zr %10.0f B/step  link/zr %s\n' "$mode" "${link[$mode]}" "$zb" \
        "$(awk -v l="${link[$mode]}" -v z="$zb" 'BEGIN { printf "%.3f", (z > 0 ? l / z : 0) }')"
    [ "$ok" = 1 ] || { echo "cluster_smoke: FAIL: $mode: link and zr counters differ by more than 10%"; fail=1; }
done
if [ "${link[zeropp]}" -ge "${link[zero3_bf16]}" ]; then
    echo "cluster_smoke: FAIL: ZeRO++ link bytes not below ZeRO-3's"
    fail=1
fi
[ $fail = 0 ] && echo "cluster_smoke: ok"
exit $fail
