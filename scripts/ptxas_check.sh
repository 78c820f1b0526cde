#!/bin/sh
# ptxas_check.sh - fail if a kernel in ptxas' report (nvcc -Xptxas -v, saved
# by the Makefile as build/<variant>/ptxas.txt) spills registers or uses
# local memory (a stack frame). zr's kernels are memory-bound loops whose
# working set must stay in registers and shared memory: a spill is a round
# trip to DRAM per element, which ptxas only mentions, so the test builds
# refuse it here.
#
# usage: scripts/ptxas_check.sh build/release/ptxas.txt
set -eu
report=$1
[ -r "$report" ] || { echo "ptxas_check: cannot read $report" >&2; exit 1; }
awk '
/Compiling entry function/ {
    fn = $0; sub(/.*function \047/, "", fn); arch = fn; sub(/\047.*/, "", fn)
    sub(/.* for \047/, "", arch); sub(/\047.*/, "", arch); kernels++
}
/bytes stack frame/ {
    split($0, w, /[ ,]+/)
    # "    N bytes stack frame, S bytes spill stores, L bytes spill loads"
    n = 0
    for (i = 1; i <= length(w); i++) if (w[i] ~ /^[0-9]+$/) v[++n] = w[i]
    if (v[1] != 0 || v[2] != 0 || v[3] != 0) {
        printf "ptxas_check: %s (%s): %d bytes stack frame, %d bytes spill stores, %d bytes spill loads\n", fn, arch, v[1], v[2], v[3]
        bad++
    }
}
END {
    if (kernels == 0) { print "ptxas_check: no kernels in the report"; exit 1 }
    if (bad > 0) { printf "ptxas_check: %d of %d kernel builds use local memory or spill\n", bad, kernels; exit 1 }
}' "$report"
