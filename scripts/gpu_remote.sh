#!/bin/bash
# gpu_remote.sh - on a lent GPU machine, in one call: unpack what
# scripts/gpu_bundle.sh packed (DIR), then the stages asked for, in order,
# each skipped once too little of the time budget is left. Everything printed
# goes to $OUT/log.txt too; the test logs, sanitizer reports and bench tables
# to $OUT (at most 7 files: a lease returns 8).
#
#   scripts/gpu_remote.sh DIR [suite|suite-short] [memcheck] [bench] [plan] [cpu] [compare]
#                         [profile]   (default: suite bench)
#   BUDGET=seconds (default 420): stop starting stages past it
#
#   suite     tests/run.sh --suite gpu (make gpu-test's first pass)
#   suite-short  the gpu suite's single-process kernel and model tests and test_gpu_train on
#             one rank (not the multi-rank transports and collectives, the --launch stalls)
#   memcheck  the gpu suite again under compute-sanitizer memcheck, then racecheck and
#             synccheck on the single-process kernel tests (make gpu-test runs all three
#             tools on the whole suite: longer than a lease; racecheck alone took over 90 s
#             on test_gpu_model on an H200)
#   bench     zr bench model / quant --device cuda, zr bench train --device cuda on 1 rank
#   plan      zr probe and zr plan on the GPU for GPT-2 124M (B 4, T 1024), then zr bench train
#             of the plan's pick and of ZeRO-3 and ZeRO++: predicted against measured step
#             times, with 1 rank and with 2 ranks sharing the GPU as 2 emulated nodes (staged)
#   cpu       zr bench model --quick --threads 1,2,8 on the machine's CPU (another kind)
#   compare   zr bench model and zr bench quant --device cuda of this build and of the
#             previous main's zr (DIR/old/zr.xz, where gpu_bundle.sh was given OLD=) side by
#             side, then the PyTorch reference (bench/gpu/torch_gpt2.py: eager and
#             torch.compile) at zr's micro-batch, all in this one call; then the table side
#             by side (bench/gpu/compare_table.py, with attention's ms where a profile stage
#             ran before it); TORCH=0 leaves PyTorch and the table out
#   tests     each program named in TESTS (default: the single-process gpu tests), directly,
#             or under compute-sanitizer --tool $SAN where SAN is set
#   variants  this build's zr bench model with ZR_GEMM_EPILOGUE=0 (the unfused GEMMs, for
#             the fused ones' gain) and zr bench attention (each attention kernel variant)
#   profile   the GPU time of each kernel of zr bench model's steps (ncu, one metric,
#             --clock-control none), summed by kernel name and divided into steps
#
# Runs as root on a throw-away machine: the carried packages are unpacked into
# / where their paths are compiled in (Open MPI, PMIx: only where the image
# has no Open MPI 4 of its own; mixing the carried Open MPI with the image's
# PMIx crashed mpirun in libpmix), elsewhere into /opt/zrdeps.
set -u
cd "$(dirname "$0")/.." || exit 2
dir=${1:?usage: gpu_remote.sh DIR [suite] [memcheck] [bench] [plan] [cpu]}
shift
stages=${*:-suite bench}
T0=$SECONDS
left() { echo $((${BUDGET:-420} - (SECONDS - T0))); }
O=${OUT:-/tmp/zr-gpu-out}
mkdir -p "$O"
exec > >(tee "$O/log.txt") 2>&1

echo "== machine"
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
lscpu | grep -E "^Model name|^CPU\(s\)"
grep -o -w 'avx2\|avx512f\|avx512bw\|avx512vl\|avx512_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '
echo
grep PRETTY_NAME /etc/os-release

echo "== libraries"
own=0
if command -v mpirun >/dev/null && mpirun --version 2>&1 | grep -q "Open MPI) 4\."; then own=1; fi
echo "the image's mpirun: $(mpirun --version 2>&1 | head -n 1) (using it: $own)"
if [ $own = 0 ]; then
    rm -rf /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/x86_64-linux-gnu/openmpi
    rm -f /usr/lib/x86_64-linux-gnu/libpmix.so* /usr/lib/x86_64-linux-gnu/libmpi.so* \
        /usr/lib/x86_64-linux-gnu/libopen-rte.so* /usr/lib/x86_64-linux-gnu/libopen-pal.so*
fi
mkdir -p /opt/zrdeps
for f in "$dir"/pkg/*.deb; do
    case $f in
        *openmpi* | *pmix*) [ $own = 0 ] && dpkg -x "$f" / ;;
        *openblas* | *cjson* | *fortunes*) dpkg -x "$f" / ;;
        *) dpkg -x "$f" /opt/zrdeps ;;
    esac
done
ldconfig
if [ $own = 1 ] && ! command -v mpirun.openmpi >/dev/null; then
    ln -s "$(readlink -f "$(command -v mpirun)")" /usr/local/bin/mpirun.openmpi
fi
cu=""
for n in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    p=$(find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | grep -v zrdeps | head -n 1)
    echo "$n: ${p:-MISSING}"
    if [ -n "$p" ]; then cu="$cu:$(dirname "$p")"; fi
done
export LD_LIBRARY_PATH="/usr/lib/x86_64-linux-gnu/openblas-pthread$cu:${LD_LIBRARY_PATH:-}:/opt/zrdeps/usr/lib/x86_64-linux-gnu"
mkdir -p build
# xz-packed (gpu_bundle.sh): through python3's lzma where the image has no xz
unxz_to() { if command -v xz >/dev/null; then xz -dc "$1"; else python3 -c \
    'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"; fi; }
unxz_to "$dir/release.tar.xz" | tar xf - -C build
if [ -f "$dir/old/zr.xz" ]; then
    unxz_to "$dir/old/zr.xz" >/tmp/zr-old && chmod +x /tmp/zr-old
fi
ldd build/release/zr build/release/tests/test_gpu_train | grep "not found"

. scripts/mpienv.sh
export ZR_TEST_TIMEOUT=150
B=build/release/zr
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
for stage in $stages; do
    echo "== $stage (left $(left) s)"
    if [ "$(left)" -lt 60 ]; then
        echo "skipped: too little of BUDGET left"
        continue
    fi
    case $stage in
        suite)
            tests/run.sh --suite gpu
            tar czf "$O/test-logs.tar.gz" build/test-logs
            ;;
        suite-short)
            tests/run.sh --suite gpu --filter \
                '^(test_device|test_cudalib|test_gpu_quant|test_gemm_plan|test_backend_ops|test_gpu_flash|test_gpu_gemm_epi|test_gpu_model) np=-|^test_gpu_train np=1 '
            tar czf "$O/test-logs.tar.gz" build/test-logs
            ;;
        memcheck)
            # --report-api-errors no: see scripts/gpu_test.sh
            ZR_TEST_WRAP="$san --tool memcheck --report-api-errors no --error-exitcode 99" \
                tests/run.sh --suite gpu
            tar czf "$O/test-logs-memcheck.tar.gz" build/test-logs
            for tool in racecheck synccheck; do
                for t in test_backend_ops test_gpu_quant; do
                    timeout 90 "$san" --tool $tool --error-exitcode 99 build/release/tests/$t \
                        >/tmp/zr-san.txt 2>&1
                    echo "$tool $t: exit $? $(grep -E '^[0-9]+ passed' /tmp/zr-san.txt)"
                    cat /tmp/zr-san.txt >>"$O/sanitize.txt"
                done
            done
            ;;
        bench)
            {
                timeout 100 $B bench model --device cuda --json
                timeout 60 $B bench quant --device cuda --json
                timeout 60 mpirun.openmpi -np 1 $B bench train --device cuda --json
            } 2>&1 | tee "$O/bench-gpu.txt"
            ;;
        plan)
            m=(--layers 12 --channels 768 --heads 12 --micro-batch 4 --device cuda)
            for np in 1 2; do
                echo "-- $np rank(s), each its own emulated node"
                ZR_RANKS_PER_NODE=1 timeout 200 mpirun.openmpi -np $np $B probe "${m[@]}" \
                    --seq-len 1024 --max-seq-len 1024 -o /tmp/zr-probe-$np.json &&
                    $B plan "${m[@]}" --seq-len 1024 --max-seq-len 1024 --train_batch_size \
                        $((4 * np)) --probe /tmp/zr-probe-$np.json \
                        --write-config /tmp/zr-pick-$np.json >/tmp/zr-plan-$np.txt &&
                    head -n 12 /tmp/zr-plan-$np.txt &&
                    ZR_RANKS_PER_NODE=1 timeout 200 mpirun.openmpi -np $np $B bench train \
                        "${m[@]}" --seq 1024 --steps 8 --modes zero3_bf16,zeropp,config \
                        --config /tmp/zr-pick-$np.json
                cat /tmp/zr-probe-$np.json
            done 2>&1 | tee "$O/plan-gpu.txt"
            ;;
        compare)
            for z in "$B" /tmp/zr-old; do
                [ -x "$z" ] || continue
                echo "-- $z"
                timeout 100 "$z" bench model --device cuda --json
                timeout 60 "$z" bench quant --device cuda --json
            done 2>&1 | tee "$O/compare.txt"
            b=$(grep -o '"B":[0-9]*' "$O/compare.txt" | head -n 1 | cut -d: -f2)
            [ "${TORCH:-1}" = 0 ] && continue
            PYTHONUNBUFFERED=1 timeout $(($(left) - 20)) python3 bench/gpu/torch_gpt2.py \
                --batch "${b:-32}" --json 2>&1 | grep -v Warning | tee -a "$O/compare.txt"
            prof=()
            [ -s "$O/profile.txt" ] && prof=(--profile "$O/profile.txt")
            python3 bench/gpu/compare_table.py "$O/compare.txt" "${prof[@]}" | tee "$O/compare-table.txt"
            ;;
        tests)
            for t in ${TESTS:-test_device test_cudalib test_gpu_quant test_backend_ops test_gpu_model}; do
                # SAN=memcheck (or racecheck, synccheck): each under compute-sanitizer
                w=()
                [ -n "${SAN:-}" ] && w=("$san" --tool "$SAN" --error-exitcode 99)
                timeout 120 "${w[@]}" build/release/tests/$t >"/tmp/zr-$t.txt" 2>&1
                echo "$t: exit $? $(grep -E '^[0-9]+ passed' "/tmp/zr-$t.txt")"
                cat "/tmp/zr-$t.txt" >>"$O/tests.txt"
            done
            ;;
        variants)
            {
                ZR_GEMM_EPILOGUE=0 timeout 100 $B bench model --device cuda --json
                timeout 120 $B bench attention --device cuda --json
            } 2>&1 | tee "$O/variants.txt"
            ;;
        profile)
            n=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
            timeout 200 "$n" --clock-control none --metrics gpu__time_duration.sum --csv \
                --launch-count "${LAUNCHES:-1800}" $B bench model --device cuda \
                >"$O/ncu.csv" 2>/tmp/zr-ncu.err
            echo "ncu: exit $? $(tail -n 2 /tmp/zr-ncu.err)"
            python3 scripts/ncu_steps.py "$O/ncu.csv" | tee "$O/profile.txt"
            ;;
        cpu)
            timeout $(($(left) - 10)) $B bench model --quick --threads 1,2,8 --json 2>&1 |
                tee "$O/bench-cpu.txt"
            ;;
        *) echo "gpu_remote.sh: unknown stage $stage" ;;
    esac
done
echo "== done in $((SECONDS - T0)) s"
