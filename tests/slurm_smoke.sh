#!/bin/bash
# slurm_smoke.sh - zr under Slurm (Debian's slurm-wlm) on the emulated cluster:
# scripts/slurm.sh up 2 (slurmctld, a slurmd per node, munge), then srun with
# 2 nodes x 2 tasks, a tiny GPT on a byte-level text file:
#   1. train 20 steps with --ckpt-dir                  -> exit 0, checkpoint at 20, nodes detected
#   2. --resume to 30                                  -> starts at step 21, metrics 1..30 once each
#   3. --time=1 and a run far too long for it: at the limit Slurm sends SIGTERM
#      (KillWait 30 s before SIGKILL)                  -> zr finishes the step, checkpoints at S > 0,
#                                                         srun exits 0, the job ends in TIMEOUT
#   4. --resume to S + 10                              -> starts at S + 1, metrics 1..S+10 once each
# Exit 0 pass, 1 fail, 77 skipped (not root, no namespaces, Slurm cannot be
# installed, or the emulated cluster stays busy for 5 min). ~2 min, most of it waiting
# for the time limit (slurmctld checks limits every few tens of seconds).
set -u
cd "$(dirname "$0")/.." || exit 1
SLURM="$PWD/scripts/slurm.sh"
ZR="${ZR_BIN:-$PWD/build/release/zr}" # test_slurm passes the zr of its build
MODEL=(--layers 2 --channels 64 --heads 4 --seq-len 16 --micro-batch 1)
SRUN=(srun -N 2 --ntasks-per-node=2)

say() { echo "slurm_smoke: $*"; }
skip() { say "skipped: $*"; exit 77; }
[ -x "$ZR" ] || { say "$ZR is not built (make)"; exit 1; }
command -v jq >/dev/null || skip "jq is not installed"
"$SLURM" setup || { rc=$?; [ $rc = 77 ] && skip "Slurm unavailable (slurm.sh setup exit 77)"; say "slurm.sh setup failed ($rc)"; exit 1; }

# The emulated cluster is shared: wait while someone measures on it or owns it,
# at most 5 minutes (the test runner gives a test 10 minutes in all).
rc=75
for _ in $(seq 15); do
    if [ -e /tmp/zr-measuring ]; then sleep 20; continue; fi
    "$SLURM" up 2 --slots 2
    rc=$?
    [ $rc = 75 ] || break
    sleep 20
done
case $rc in
    0) ;;
    77|75) skip "emulated cluster unavailable (slurm.sh up exit $rc)" ;;
    *) say "slurm.sh up failed ($rc)"; exit 1 ;;
esac
# Node-local /tmp is private to each node: the work directory is on the shared tree.
mkdir -p build
W=$(mktemp -d "$PWD/build/slurm-smoke.XXXXXX") || { "$SLURM" down; exit 1; }
trap '"$SLURM" down; rm -rf "$W"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# whoever reads our output is gone (test_slurm killed by the runner's timeout):
# tear down quietly instead of dying of SIGPIPE with the cluster left up
trap 'exec >/dev/null 2>&1; exit 141' PIPE
trap 'exec >/dev/null 2>&1; exit 129' HUP

awk 'BEGIN { for (i = 0; i < 4000; i++)
    printf "line %d: the quick brown fox jumps over the lazy dog %d times.\n", i, (i * 7) % 13 }' >"$W/data.txt"

fail=0
check() { # check COND-STATUS MESSAGE
    if [ "$1" = 0 ]; then say "ok: $2"; else say "FAIL: $2"; fail=1; fi
}
# srun_zr LOG SRUN-OPTIONS... -- ZR-TRAIN-ARGS... : exit status of srun, output in LOG
srun_zr() {
    local log=$1 opts=()
    shift
    while [ "$1" != -- ]; do opts+=("$1"); shift; done
    shift
    "$SLURM" exec --timeout 300 -- "${SRUN[@]}" "${opts[@]}" "$ZR" train --data "$W/data.txt" \
        "${MODEL[@]}" "$@" >"$log" 2>&1
}
# metrics_ok DIR LAST: metrics.jsonl holds steps 1..LAST, each once, in order
metrics_ok() {
    jq -r .step "$1/metrics.jsonl" | awk -v last="$2" '$1 != NR { bad = 1 } END { exit !(NR == last && !bad) }'
}
first_step() { grep -m1 -oE '^step +[0-9]+/' "$1" | grep -oE '[0-9]+'; }

# 1. train with checkpoints
srun_zr "$W/a.log" -- --steps 20 --ckpt-dir "$W/ck" --ckpt-every 10
rc=$?
check $rc "srun train --steps 20 exits 0 (got $rc)"
grep -q '4 ranks = 2 nodes x 2 (detected)' "$W/a.log"
check $? "zr detects 2 nodes x 2 ranks under srun"
[ -d "$W/ck/step_00000020" ] && metrics_ok "$W/ck" 20
check $? "checkpoint step_00000020, metrics steps 1..20"

# 2. resume through srun
srun_zr "$W/b.log" -- --steps 30 --ckpt-dir "$W/ck" --ckpt-every 10 --resume
rc=$?
check $rc "srun train --resume --steps 30 exits 0 (got $rc)"
grep -q "resumed from $W/ck/step_00000020 (step 20," "$W/b.log" && [ "$(first_step "$W/b.log")" = 21 ]
check $? "resumed run starts at step 21 (first step line: $(first_step "$W/b.log"))"
[ -d "$W/ck/step_00000030" ] && metrics_ok "$W/ck" 30
check $? "checkpoint step_00000030, metrics steps 1..30 once each"

# 3. the time limit: SIGTERM from Slurm, checkpoint, exit 0
t0=$(date +%s)
srun_zr "$W/c.log" --time=1 --job-name=zr-timelimit -- --steps 100000000 --ckpt-dir "$W/tl" --ckpt-every 100000000
rc=$?
dt=$(($(date +%s) - t0))
check $rc "srun --time=1 of a long run exits 0 after the time limit (got $rc after ${dt}s)"
grep -q 'DUE TO TIME LIMIT' "$W/c.log"
check $? "Slurm cancelled the step at its time limit"
S=$(sed -n 's/^zr train: stop requested; finished step \([0-9]*\), checkpoint .*/\1/p' "$W/c.log")
[ -n "$S" ] && [ "$S" -gt 0 ] && [ -d "$W/tl/$(printf 'step_%08d' "$S")" ] && metrics_ok "$W/tl" "$S"
check $? "stopped at step ${S:-?} > 0 with its checkpoint, metrics steps 1..${S:-?}"
# srun returns once the tasks have exited; the job may still be COMPLETING (its epilog, the
# step's cleanup) for a few seconds: wait for a final state (bounded: KillWait is 30 s)
for _ in $(seq 60); do
    state=$("$SLURM" exec -- scontrol -o show job 2>/dev/null | grep 'JobName=zr-timelimit' |
        grep -oE 'JobState=[A-Z_]+ .*ExitCode=[0-9:]+' | awk '{ print $1, $NF }')
    case "$state" in JobState=COMPLETING*|JobState=RUNNING*|'') sleep 1 ;; *) break ;; esac
done
[ "$state" = "JobState=TIMEOUT ExitCode=0:0" ]
check $? "job state after the limit: ${state:-none}"
grep -E 'TIME LIMIT|stop requested|continue with' "$W/c.log" | sed 's/^/    /'

# 4. resume from the time-limit checkpoint
if [ -n "$S" ]; then
    srun_zr "$W/d.log" -- --steps $((S + 10)) --ckpt-dir "$W/tl" --ckpt-every 100000000 --resume
    rc=$?
    check $rc "srun train --resume --steps $((S + 10)) exits 0 (got $rc)"
    grep -q "resumed from $W/tl/$(printf 'step_%08d' "$S") (step $S," "$W/d.log" &&
        [ "$(first_step "$W/d.log")" = $((S + 1)) ]
    check $? "resumed run starts at step $((S + 1)) (first step line: $(first_step "$W/d.log"))"
    [ -d "$W/tl/$(printf 'step_%08d' $((S + 10)))" ] && metrics_ok "$W/tl" $((S + 10))
    check $? "checkpoint at step $((S + 10)), metrics steps 1..$((S + 10)) once each"
fi

if [ $fail != 0 ]; then
    for f in "$W"/?.log; do echo "--- $f"; grep -vE '^[a-z0-9_.]+ +=' "$f" | tail -n 8; done
    exit 1
fi
say "ok"
exit 0
