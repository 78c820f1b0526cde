#!/bin/sh
# setup.sh - install the Debian packages zr builds, tests and runs with.
#
# Idempotent and quiet: when every package is already installed it prints
# nothing and returns at once. Needs root, or a user with sudo.
set -eu

# compilers and MPI (Open MPI is the default transport; MPICH is built too so
# that zr never depends on one implementation by accident; clang compiles the
# tree in make test's matrix so a warning only one compiler sees fails on every
# machine; g++ builds the CUDA kernels for the GPU emulator, tests/emu), BLAS,
# JSON, charts, the default training corpus (fortunes), and iproute2 and jq for
# the emulated cluster. oneDNN runs the bf16 matrix products on CPUs with
# AMX-BF16 or AVX512_BF16 (src/base/blas_bf16.c; opened at run time, like
# OpenBLAS, so zr runs without it, in fp32).
PKGS="make gcc g++ clang clang-format pkg-config openmpi-bin libopenmpi-dev mpich libmpich-dev
libopenblas-dev libcjson-dev libdnnl-dev gnuplot-nox fortunes iproute2 procps jq"

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "setup: installing$missing"
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
    else
        echo "setup: these Debian packages are missing:$missing" >&2
        echo "setup: run as root or install sudo, then run this command again" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "setup: done"
