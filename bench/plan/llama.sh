#!/bin/sh
# bench/plan/llama.sh - the planner against a Llama-family run (issue 43): zr probe and
# zr plan for a SmolLM2-135M-shaped Hugging Face folder trained with ZeRO++ (stage 3, qwZ,
# hpZ, qgZ: zr train's defaults at stage 3) on 4 ranks as 2 emulated nodes x 2, then ROUNDS
# launches of that run, each STEPS steps under /usr/bin/time: the plan's step time and
# memory per rank for that configuration against the measured ones.
#
#   bench/plan/llama.sh [--json] [OUTDIR]     (default OUTDIR bench/plan/results)
#
# Env: ZR (build/release/zr), ZR_LLAMA_DIR (/tmp/smol135, made by
# scripts/hf_random_model.py with /tmp/hfvenv/bin/python when missing: 540 MB), ROUNDS (2),
# STEPS (5: the first, warm-up, is left out of the step time). Needs Open MPI and GNU time;
# 2-core machine: about 6 minutes for the probe and 2 minutes per launch.
set -eu
json=0
if [ "${1:-}" = "--json" ]; then
    json=1
    shift
fi
out=${1:-bench/plan/results}
zr=${ZR:-build/release/zr}
dir=${ZR_LLAMA_DIR:-/tmp/smol135}
rounds=${ROUNDS:-2}
steps=${STEPS:-5}
mkdir -p "$out"
if [ ! -d "$dir" ]; then
    /tmp/hfvenv/bin/python scripts/hf_random_model.py "$dir"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi="mpirun --oversubscribe -np 4 -x ZR_RANKS_PER_NODE=2"
model="--init $dir --vocab-size 49152 --seq-len 128 --micro-batch 1 --threads 1"
run="--stage 3 --qwz --hpz 0 --qgz --val-every 0"

start=$(date +%s)
# shellcheck disable=SC2086
$mpi "$zr" probe $model -o "$out/probe.json" >"$out/probe.log" 2>&1
probe_s=$(($(date +%s) - start))
# shellcheck disable=SC2086
"$zr" plan $model --probe "$out/probe.json" --json >"$out/plan.json" 2>"$out/plan.log"
r=1
while [ "$r" -le "$rounds" ]; do
    rm -f "$out/metrics-$r.jsonl"
    # shellcheck disable=SC2086
    $mpi /usr/bin/time -f "maxrss_kb %M" "$zr" train $model $run --steps "$steps" \
        --metrics "$out/metrics-$r.jsonl" >"$out/train-$r.log" 2>&1
    r=$((r + 1))
done

python3 - "$out" "$rounds" "$probe_s" "$json" <<'PY'
import json, re, statistics, sys
out, rounds, probe_s, as_json = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
log = open(f"{out}/train-1.log").read()
key = lambda k: int(re.search(rf"{re.escape(k)}\s*=\s*(\d+)", log).group(1))
want = dict(stage=3, qwz=1, qwz_bits=key("zr.quant.qwz_bits"), hpz=2, qgz=1,
            qgz_bits=key("zr.quant.qgz_bits"), micro_batch=1, accum=1,
            prefetch_bucket=key("zero_optimization.stage3_prefetch_bucket_size"))
plan = json.load(open(f"{out}/plan.json"))
row = [c for c in plan["configs"] if all(c[k] == v for k, v in want.items())][0]
steps, medians, rss, lines = [], [], [], []
for r in range(1, rounds + 1):
    m = [json.loads(l) for l in open(f"{out}/metrics-{r}.jsonl")]
    t = [x["t_step"] for x in m[1:]]  # the first step warms up
    steps += t
    medians.append(statistics.median(t))
    rss += [int(k) * 1024 for k in re.findall(r"maxrss_kb (\d+)", open(f"{out}/train-{r}.log").read())]
    lines.append(f"round {r}: steps {' '.join('%.2f' % x for x in t)} s, median {medians[-1]:.2f}")
start = re.search(r"predicted peak per rank ([0-9.]+) GB", log).group(1)
measured = statistics.median(steps)
s = {
    "model": "SmolLM2-135M-shaped Llama (random), T=128, micro 1, 4 ranks as 2x2, threads 1",
    "config": "stage 3 + qwZ(%d) + hpZ(2) + qgZ(%d), micro 1 x 1" % (want["qwz_bits"], want["qgz_bits"]),
    "probe_s": probe_s,
    "plan_rank": row["rank"],
    "plan_step_s": row["step_ms"] / 1e3,
    "plan_compute_s": row["compute_ms"] / 1e3,
    "measured_step_s_median": measured,
    "measured_step_s_min": min(steps),
    "measured_step_s_max": max(steps),
    "measured_round_medians_s": medians,
    "step_err": row["step_ms"] / 1e3 / measured - 1,
    "plan_memory_bytes": row["memory_bytes"],
    "plan_state_bytes": row["state_bytes"],
    "plan_activation_bytes": row["activation_bytes"],
    "plan_pool_bytes": row["pool_bytes"],
    "trainer_startup_prediction_gb": float(start),
    "measured_peak_rss_bytes_max": max(rss),
    "measured_peak_rss_bytes_min": min(rss),
    "memory_ratio": row["memory_bytes"] / max(rss),
}
json.dump(s, open(f"{out}/summary.json", "w"), indent=1)
if as_json:
    print(json.dumps(s))
else:
    print("\n".join(lines))
    print(f"plan: {s['plan_step_s']:.2f} s per step (rank {row['rank']} of {len(plan['configs'])}), "
          f"measured median {measured:.2f} s (min {min(steps):.2f}, max {max(steps):.2f}): "
          f"{100 * s['step_err']:+.1f}%")
    print(f"memory per rank: plan {row['memory_bytes'] / 1e9:.3f} GB, measured peak RSS "
          f"{max(rss) / 1e9:.3f} GB: ratio {s['memory_ratio']:.3f} (start-up bound {start} GB)")
PY
