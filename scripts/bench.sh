#!/bin/sh
# bench.sh - "make bench": every benchmark in bench/ once, tables to the
# terminal and each --json summary into results/bench-<time>/.
#   quant   one rank: codec GB/s vs memcpy, error by group size
#   model   one rank: GPT train step tokens/s, FLOP rate vs sgemm (--quick: T=256)
#   comm    4 ranks as 2 emulated nodes: collectives, ZeRO-3 vs ZeRO++ bytes
#   train   4 ranks as 2 emulated nodes: training step per ZeRO++ mode
# The emulated cluster with bandwidth-limited links is bench/cluster/run.sh
# (needs root). Timings on a shared 2-core machine are noisy: compare ratios
# measured in the same run, and medians.
set -eu
cd "$(dirname "$0")/.."
. scripts/mpienv.sh
out="results/bench-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
zr=build/release/zr
run() { # name, command...
    name=$1; shift
    echo "== $name"
    "$@" --json | tee "$out/$name.txt"
    tail -n 1 "$out/$name.txt" > "$out/$name.json"
}
run quant $zr bench quant
run model $zr bench model --quick
run comm mpirun.openmpi -np 4 -x ZR_RANKS_PER_NODE=2 $zr bench comm
run train mpirun.openmpi -np 4 -x ZR_RANKS_PER_NODE=2 $zr bench train
echo "summaries in $out/*.json"
