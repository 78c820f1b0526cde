#!/bin/bash
# gpu_test.sh - "make gpu-test": the gpu suite of tests/testlist on this
# machine's GPU, then again under each of compute-sanitizer's tools (memcheck:
# out-of-bounds and uninitialised device memory; racecheck: shared-memory
# hazards; synccheck: barriers not every thread reaches) where the CUDA image
# has compute-sanitizer. Without a GPU every program says it was skipped, and
# so do the sanitizer passes.
set -u
cd "$(dirname "$0")/.." || exit 2
rc=0
tests/run.sh --suite gpu || rc=1
san=$(command -v compute-sanitizer || true)
if [ -z "$san" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" ]; then
    san="${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer"
fi
if [ -z "$san" ]; then
    echo "skipped: compute-sanitizer passes (compute-sanitizer not found in PATH or CUDA_HOME/bin)"
    exit $rc
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "skipped: compute-sanitizer passes (no GPU found by nvidia-smi -L)"
    exit $rc
fi
# --report-api-errors no: NCCL's communicator set-up asks for kernel images of other
# architectures and gets cudaErrorNoKernelImageForDevice by design (on an H200 with NCCL 2.28,
# 2026-11-27: 96 reports in test_transport, 32 in test_gpu_coll, every one inside
# ncclInitKernelsForDevice, and no memory error), which would fail every NCCL test; zr checks the
# status of each CUDA call it makes itself.
for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer --tool $tool"
    ZR_TEST_WRAP="$san --tool $tool --report-api-errors no --error-exitcode 99" \
        tests/run.sh --suite gpu || rc=1
done
exit $rc
