#!/bin/sh
# bench/cpu/bf16.sh - zr bench model against PyTorch's CPU training step, fp32 and bf16 products,
# side by side (issue 40): per rep one `zr bench model --json` call (fp32 and, where zr has
# --products, bf16), then bench/cpu/torch_gpt.py (fp32, then bf16 autocast), the same configs
# and thread counts; --reps times, interleaved. Prints a table of medians over the reps and,
# with --json, the raw lines (one per run, "system" zr or torch, "rep" the rep).
#
# Usage: bench/cpu/bf16.sh [--reps N] [--threads 1,2] [--quick] [--json] [--out FILE.jsonl]
#        bench/cpu/bf16.sh --table FILE.jsonl   (the table of a saved run, nothing run)
#   --quick: a smoke run of about a minute (zr bench model --quick; torch: small, 2 steps)
# Needs: make (build/release/zr) and PyTorch: PYTHON=/path/to/python picks the interpreter that
# has torch (default python3; on this project's VMs /tmp/peers-venv/bin/python).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
py=${PYTHON:-python3}
zr=${ZR:-build/release/zr}
reps=3 threads=1,2 quick='' json='' out='' table=''
while [ $# -gt 0 ]; do
    case $1 in
    --reps) reps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --quick) quick=--quick; shift ;;
    --json) json=1; shift ;;
    --out) out=$2; shift 2 ;;
    --table) table=$2; shift 2 ;;
    *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; [ "$1" = --help ] && exit 0; exit 2 ;;
    esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the reps: per rep zr bench model, then torch_gpt.py, their lines into $tmp/runs.jsonl
run_reps() {
    [ -x "$zr" ] || { echo "bf16.sh: no $zr: run make" >&2; exit 1; }
    "$py" -c 'import torch' 2>/dev/null ||
        { echo "bf16.sh: PyTorch is missing in $py: set PYTHON= (pip install torch)" >&2; exit 1; }
    # zr's bf16 products when its bench has them (--products); otherwise its fp32 only
    zprod=
    "$zr" bench model --help 2>&1 | grep -q -- --products && zprod="--products fp32,bf16"
    [ -n "$zprod" ] || echo "bf16.sh: this zr bench model has no --products: zr runs fp32 only" >&2
    echo "bf16.sh: $reps rep(s), threads $threads${quick:+, quick}; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    r=1
    while [ "$r" -le "$reps" ]; do
        echo "bf16.sh: rep $r: zr" >&2
        load=$(cut -d' ' -f1 /proc/loadavg) # the 1-minute load average before each call
        # shellcheck disable=SC2086
        "$zr" bench model --json --threads "$threads" $quick $zprod >"$tmp/zr.out"
        grep '^{"bench":"model"' "$tmp/zr.out" | "$py" -c '
import json, sys
top = json.loads(sys.stdin.read())
for x in top["runs"]:
    x.update(system="zr", rep=int(sys.argv[1]), load1=float(sys.argv[2]),
             products=x.get("products", "fp32"),
             blas_core=top["blas_core"], cpu_features=top["cpu_features"])
    # zr names the bf16 kernel once ("bf16_products"); fp32 runs the OpenBLAS kernels
    kern = {"fp32": "openblas:" + top["blas_core"], "bf16": top.get("bf16_products", "?")}
    x.setdefault("products_kernel", kern[x["products"]])
    print(json.dumps(x))
' "$r" "$load" >>"$tmp/runs.jsonl"
        echo "bf16.sh: rep $r: torch" >&2
        load=$(cut -d' ' -f1 /proc/loadavg)
        # shellcheck disable=SC2086
        "$py" "$here/torch_gpt.py" --json --threads "$threads" $quick >"$tmp/torch.out"
        grep '^{' "$tmp/torch.out" | "$py" -c '
import json, sys
for line in sys.stdin:
    x = json.loads(line)
    x.update(rep=int(sys.argv[1]), load1=float(sys.argv[2]))
    print(json.dumps(x))
' "$r" "$load" >>"$tmp/runs.jsonl"
        [ -z "$out" ] || cp "$tmp/runs.jsonl" "$out" # after every rep: a stopped run keeps its reps
        r=$((r + 1))
    done
    echo "bf16.sh: load after $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    [ -z "$json" ] || cat "$tmp/runs.jsonl"
}

if [ -n "$table" ]; then
    cp "$table" "$tmp/runs.jsonl"
else
    run_reps
fi

"$py" - "$tmp/runs.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = statistics.median
def key(x):
    return (x["config"], x["T"], x["threads"])
def per_rep(x, system, products):
    """The tokens/s of (system, products) in x's rep, config and threads."""
    for y in runs:
        if y["rep"] == x["rep"] and key(y) == key(x) and (y["system"], y["products"]) == (system, products):
            return y["tokens_per_s"]
    return None
def ratio(rows, system, products):
    """Median (min-max) over the reps of tokens/s over the same rep's (system, products)."""
    v = [x["tokens_per_s"] / d for x in rows if (d := per_rep(x, system, products))]
    if not v:
        return "-"
    return f"{med(v):.2f}" + (f" ({min(v):.2f}-{max(v):.2f})" if len(v) > 1 else "")
groups = {}
for x in runs:
    groups.setdefault((key(x), x["system"], x["products"]), []).append(x)
order = sorted(groups, key=lambda g: (g[0][2], g[0][0] != "small", g[0][1], g[1] != "zr", g[2] != "fp32"))
print(f"\n| config | threads | system | products | ms/step (min-max) | tokens/s | x zr fp32 | x torch bf16 |")
print("|---|---:|---|---|---:|---:|---:|---:|")
for g in order:
    rows = groups[g]
    ms = [x["ms_per_step"] for x in rows]
    (cfg, T, th), system, prod = g
    print(f"| {cfg} T {T} | {th} | {system} | {prod} | {med(ms):.1f} ({min(ms):.1f}-{max(ms):.1f}) "
          f"| {med(x['tokens_per_s'] for x in rows):.0f} | {ratio(rows, 'zr', 'fp32')} "
          f"| {ratio(rows, 'torch', 'bf16')} |")
load = [x["load1"] for x in runs if "load1" in x]
print(f"\n{len(set(x['rep'] for x in runs))} rep(s); ratios: the median over reps of tokens/s over "
      f"the same rep's row" + (f"; 1-minute load before the calls {min(load):.2f}-{max(load):.2f}" if load else ""))
kern = {}
for x in runs:
    kern.setdefault((x["system"], x["products"]), set()).add(x.get("products_kernel", "?"))
for (system, prod), k in sorted(kern.items()):
    print(f"kernel: {system} {prod}: {', '.join(sorted(k))}")
EOF
