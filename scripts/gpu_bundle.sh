#!/bin/bash
# gpu_bundle.sh - on a machine with a CUDA toolkit but no GPU: pack what a
# lent GPU machine needs to run the gpu suite and the GPU benches, into one
# folder that git ignores (default .dev/), for scripts/gpu_remote.sh there.
#
#   [OLD=zr-of-the-previous-main] scripts/gpu_bundle.sh [DIR]
#
# OLD: a zr program built from the previous main, packed as DIR/old/zr.xz for
# gpu_remote.sh's compare stage (this build and the previous one in one call).
#
# Why not build there: a lent machine (a CUDA image, Ubuntu 24.04 on
# 2026-11-27) has nvcc, cuBLAS, NCCL and its own Open MPI 4.1, but no OpenBLAS,
# cJSON or default corpus, and cannot reach a package archive; its lease is
# minutes. So the release build made here travels (stripped, ~30 MB xz-packed:
# the programs of the gpu suite and the small test programs test_cudalib
# counts), with the Debian packages the build links against that such an image
# lacks (OpenBLAS, cJSON, gfortran's runtime, fortunes, and Open MPI with
# PMIx for an image without its own). The binaries link the CUDA runtime
# statically and open cuBLAS and NCCL by soname (src/base/cudalib.h), so they
# take the machine's own.
set -eu
cd "$(dirname "$0")/.."
dir=${1:-.dev}
case $dir in /* | *..*) echo "gpu_bundle.sh: give a folder inside the repository" >&2; exit 2 ;; esac
git check-ignore -q "$dir" || { echo "gpu_bundle.sh: $dir is not ignored by git (.gitignore)" >&2; exit 2; }
make -s -j"$(nproc)" build CUDA=1
rm -rf "$dir" && mkdir -p "$dir/pkg" "$dir/release/tests"
# the gpu suite's programs, and every test program under 2 MB (test_cudalib wants ten or more)
gpu=$(awk '$1 ~ /^test_/ && $4 ~ /(^|,)gpu(,|$)/ {print $1}' tests/testlist | sort -u)
for t in build/release/tests/test_*; do
    case $t in *.d) continue ;; esac
    n=$(basename "$t")
    if echo "$gpu" | grep -qx "$n" || [ "$(stat -c %s "$t")" -lt 2000000 ]; then
        strip -o "$dir/release/tests/$n" "$t"
    fi
done
strip -o "$dir/release/zr" build/release/zr
# xz: the programs carry every kernel's cubins for two architectures (mostly
# zeros and repeats); gzip left the bundle over a lease's 64 MiB
tar cf - -C "$dir" release | xz -6 -T0 >"$dir/release.tar.xz"
if [ -n "${OLD:-}" ]; then
    mkdir -p "$dir/old" && strip -o "$dir/old/zr" "$OLD" && xz -6 "$dir/old/zr"
fi
rm -rf "$dir/release"
(cd "$dir/pkg" && apt-get download -qq libopenblas0-pthread libopenblas0 libcjson1 libgfortran5 \
    libquadmath0 fortunes fortunes-min openmpi-bin libopenmpi3 openmpi-common libpmix2 \
    libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7)
du -sh "$dir"
echo "then: device run, carry [\"$dir\"], command: scripts/gpu_remote.sh $dir [suite memcheck bench cpu]"
