#!/bin/sh
# sass_check.sh - what the built kernels' machine code must contain (issue
# 42's checks that need no GPU), over `cuobjdump --dump-sass` of the objects
# nvcc built for sm_80 and sm_90:
#
#   tensor cores   every kernel whose name starts with a prefix of TC_PREFIXES
#                  (below, or -t PREFIX) has HMMA (sm_80; HMMA or HGMMA on
#                  sm_90) in each architecture, and each prefix names at least
#                  one kernel in each: a tensor-core kernel that falls back to
#                  scalar FMAs, or is renamed away, fails the build
#   codecs         the kernels of src/quant/quant_cuda.cu use no local memory
#                  (no LDL / STL in their SASS; ptxas' report of that object,
#                  quant_cuda.cu.ptxas, says 0 bytes stack frame and no spills)
#
# Run by the Makefile where ptxas_check.sh runs (the test builds, WERROR=1),
# with the build's objects. cuobjdump (and nvdisasm, which it runs) come
# from $CUOBJDUMP, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, or else NVIDIA's
# PyPI packages nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm of nvcc's major
# version, installed once with pip under build/tools/cuda (a toolkit without
# them: NVIDIA's pip-installed CUDA, some containers).
#
# usage: scripts/sass_check.sh [-t PREFIX]... OBJECT.cu.o...
#   -t PREFIX  also require tensor-core instructions of kernels named PREFIX*
#              (e.g. -t att_fwd, today's scalar attention: the check fails)
set -eu

# Prefixes of kernels that must run on tensor cores, one a line.
# flash_: the attention kernels (src/model/attention_flash.cu)
TC_PREFIXES="
flash_
"

extra=""
while [ $# -gt 0 ]; do
    case $1 in
    -t)
        extra="$extra $2"
        shift 2
        ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: sass_check.sh [-t PREFIX]... OBJECT.cu.o..." >&2; exit 2; }
prefixes=$(echo "$TC_PREFIXES $extra" | tr ' ' '\n' | grep -v '^$' || true)

find_tool() {
    t=$1
    for c in "$(command -v "$t" 2>/dev/null || true)" "${CUDA_HOME:-/nonexistent}/bin/$t" \
        "/usr/local/cuda/bin/$t"; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    for c in build/tools/cuda/nvidia/*/bin/"$t"; do
        [ -x "$c" ] && { echo "$c"; return 0; }
    done
    return 1
}

cuobjdump=${CUOBJDUMP:-$(find_tool cuobjdump || true)}
if [ -z "$cuobjdump" ] || ! find_tool nvdisasm >/dev/null; then
    nvcc=${NVCC:-$(find_tool nvcc || true)}
    major=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    [ -n "$major" ] || { echo "sass_check: no cuobjdump, and no nvcc to choose one for" >&2; exit 1; }
    echo "sass_check: no cuobjdump/nvdisasm; installing NVIDIA's for CUDA $major under build/tools/cuda"
    if ! python3 -m pip install --quiet --disable-pip-version-check --target build/tools/cuda \
        "nvidia-cuda-cuobjdump==$major.*" "nvidia-cuda-nvdisasm==$major.*" >build/tools-pip.log 2>&1; then
        echo "sass_check: FAILED: pip could not install cuobjdump (build/tools-pip.log); set CUOBJDUMP" >&2
        exit 1
    fi
    cuobjdump=$(find_tool cuobjdump)
fi
PATH=$(dirname "$(find_tool nvdisasm)"):$PATH
export PATH

# One line per instruction of interest: "arch kernel mnemonic", and "arch kernel -" per kernel.
sass_lines() {
    "$cuobjdump" --dump-sass "$1" | c++filt | awk '
    /^[[:space:]]*arch = / { arch = $3 }
    /Function : / {
        fn = $0; sub(/.*Function : /, "", fn); sub(/^void /, "", fn)
        sub(/[<(].*/, "", fn); sub(/.*::/, "", fn)
        print arch, fn, "-"
    }
    /\/\*[0-9a-f]+\*\// {
        for (i = 1; i <= NF; i++) if ($i ~ /^[A-Z][A-Z0-9_.]+$/) {
            op = $i; sub(/\..*/, "", op)
            if (op ~ /^(HMMA|HGMMA|LDL|STL)$/) print arch, fn, op
            break
        }
    }'
}

bad=0
all=$(mktemp)
trap 'rm -f "$all"' EXIT
for obj in "$@"; do
    sass_lines "$obj" | sed "s|\$| $obj|" >>"$all"
done
for p in $prefixes; do
    for arch in sm_80 sm_90; do
        n=$(awk -v a="$arch" -v p="$p" '$1 == a && index($2, p) == 1 && $3 == "-"' "$all" | sort -u | wc -l)
        if [ "$n" -eq 0 ]; then
            echo "sass_check: no $arch kernel named $p* in $*"
            bad=$((bad + 1))
        fi
        awk -v a="$arch" -v p="$p" '
            $1 == a && index($2, p) == 1 { seen[$2] = 1; if ($3 == "HMMA" || $3 == "HGMMA") tc[$2] = 1 }
            END { for (k in seen) if (!(k in tc)) print k }' "$all" | sort | while read -r k; do
            echo "sass_check: $k ($arch) has no tensor-core instruction (HMMA/HGMMA)"
        done | tee -a "$all.bad"
    done
done
if [ -s "$all.bad" ]; then
    bad=$((bad + $(wc -l <"$all.bad")))
fi
rm -f "$all.bad"
# the codecs: no local memory in SASS or in ptxas' report
for obj in "$@"; do
    case $obj in
    *quant_cuda.cu.o) ;;
    *) continue ;;
    esac
    awk -v o="$obj" '$4 == o && ($3 == "LDL" || $3 == "STL") { print $1, $2, $3 }' "$all" | sort -u |
        while read -r arch k op; do
            echo "sass_check: codec kernel $k ($arch) uses local memory ($op)"
        done | tee "$all.codec"
    rep=${obj%.o}.ptxas
    if [ -r "$rep" ] && grep -E 'bytes stack frame' "$rep" | grep -Ev '^[^0-9]*0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads' >>"$all.codec"; then
        echo "sass_check: a codec kernel has a stack frame or spills ($rep)"
    fi
    [ -s "$all.codec" ] && bad=$((bad + 1))
    rm -f "$all.codec"
done
if [ "$bad" -gt 0 ]; then
    echo "sass_check: FAILED ($bad problem(s))"
    exit 1
fi
echo "sass_check: ok ($(awk '$3 == "-"' "$all" | wc -l) kernel builds; tensor cores required of:" \
    "${prefixes:-none yet})"
