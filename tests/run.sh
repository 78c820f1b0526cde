#!/bin/bash
# run.sh - run zr's test suite from tests/testlist and print one closing line
#     N passed, N failed
# summed over every test program (each prints its own such line). A program
# that crashes, times out or prints no closing line counts as one failed test.
#
# A program that cannot run here (the gpu suite without a GPU, an opt-in smoke
# test) prints "skipped: <why>" and "0 passed, 0 failed": it is listed as
# skipped, with its reason, and counts neither as passed nor as failed.
#
# usage: tests/run.sh [--suite release|asan|mpich|emu|gpu|all] [--filter REGEX] [--list FILE]
#
# testlist lines:   program  np  rpn  suites  [args...]
#   np      '-' runs the program directly; a number runs it under mpirun with np ranks
#   rpn     ranks per emulated node (sets ZR_RANKS_PER_NODE), '-' for real detection
#   suites  where the line runs: comma list of release, asan, mpich, emu, emu-tsan, gpu
#           ('all' = release, asan and mpich). --suite emu runs the emu lines from
#           build/emu and the emu-tsan lines from build/emu-tsan (the GPU emulator,
#           tests/emu); gpu lines run from build/release on this machine's GPU
#           (make gpu-test); --suite all runs every suite but gpu.
set -u
cd "$(dirname "$0")/.."

suite=all
filter=""
list=tests/testlist
while [ $# -gt 0 ]; do
    case "$1" in
        --suite) suite=$2; shift 2 ;;
        --filter) filter=$2; shift 2 ;;
        --list) list=$2; shift 2 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

# Open MPI on one machine: root allowed, oversubscribed, shared memory,
# one BLAS thread per rank (scripts/mpienv.sh).
. scripts/mpienv.sh
# ...but Open MPI's own 1 s before SIGKILL: its 30 s would be waited twice by every test whose job
# ends with an error (test_cli_rules sources mpienv.sh where it tests a stop that saves)
export OMPI_MCA_odls_base_sigkill_timeout=1
# logs, not terminals: no live progress bar from zr train
export ZR_PROGRESS=0
# ASan: single-process tests check leaks with LeakSanitizer. Under mpirun the
# MPI runtime's own plugins leak at exit from unloaded modules that no
# suppression can name, so there zr checks its own allocations instead: every
# test program fails if zr_mem_current() is not zero at the end (test.h).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
ASAN_MPI_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

TIMEOUT=${ZR_TEST_TIMEOUT:-600}
# A command every test program runs under (make gpu-test: compute-sanitizer's
# tools); under mpirun it wraps each rank, not the launcher.
read -r -a wrap <<<"${ZR_TEST_WRAP:-}"
total_pass=0
total_fail=0
total_skip=0
failed_lines=()
skipped_lines=()
log_dir=build/test-logs
mkdir -p "$log_dir"
t_start=$(date +%s)

run_suite() {
    local name=$1 build=$2 launcher=$3
    local line prog np rpn suites args cmd out rc pass fail closing i=0
    echo "== suite $name ($build)"
    while read -r prog np rpn suites args; do
        case "$prog" in ''|'#'*) continue ;; esac
        case ",$suites," in
            *",$name,"*) ;;
            *",all,"*) case $name in release|asan|mpich) ;; *) continue ;; esac ;;
            *) continue ;;
        esac
        line="$prog np=$np rpn=$rpn $args"
        if [ -n "$filter" ] && ! echo "$line" | grep -Eq "$filter"; then continue; fi
        i=$((i + 1))
        out="$log_dir/$name-$i-$prog.log"
        local envs=()
        [ "$rpn" != "-" ] && envs+=("ZR_RANKS_PER_NODE=$rpn")
        [ "$np" != "-" ] && envs+=("ASAN_OPTIONS=$ASAN_MPI_OPTIONS")
        local t0=$SECONDS
        if [ "$np" = "-" ]; then
            # shellcheck disable=SC2086
            env "${envs[@]}" timeout -k 10 "$TIMEOUT" "${wrap[@]}" "$build/tests/$prog" $args </dev/null >"$out" 2>&1
        else
            local xenv=()
            for e in "${envs[@]}"; do
                if [ "$launcher" = mpich ]; then xenv+=(-genv "${e%%=*}" "${e#*=}"); else xenv+=(-x "$e"); fi
            done
            if [ "$launcher" = mpich ]; then
                # shellcheck disable=SC2086
                timeout -k 10 "$TIMEOUT" mpiexec.mpich -n "$np" "${xenv[@]}" "${wrap[@]}" "$build/tests/$prog" $args </dev/null >"$out" 2>&1
            else
                # shellcheck disable=SC2086
                timeout -k 10 "$TIMEOUT" mpirun.openmpi -np "$np" "${xenv[@]}" "${wrap[@]}" "$build/tests/$prog" $args </dev/null >"$out" 2>&1
            fi
        fi
        rc=$?
        closing=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n 1)
        if [ -n "$closing" ]; then
            pass=${closing%% passed*}
            fail=${closing#*passed, }; fail=${fail%% failed*}
        else
            pass=0; fail=0
        fi
        if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then fail=1; fi
        total_pass=$((total_pass + pass))
        total_fail=$((total_fail + fail))
        local dt=$((SECONDS - t0))
        local skip
        skip=$(grep -m 1 -E '^skipped: ' "$out")
        if [ "$fail" -eq 0 ] && [ "$pass" -eq 0 ] && [ -n "$skip" ]; then
            total_skip=$((total_skip + 1))
            printf 'skip %-60s %3ss  (%s)\n' "$line" "$((SECONDS - t0))" "${skip#skipped: }"
            skipped_lines+=("$name: $line: ${skip#skipped: }")
            continue
        fi
        if [ "$fail" -ne 0 ]; then
            printf 'FAIL %-60s %3ss  (%s passed, %s failed, exit %s)\n' "$line" "$dt" "$pass" "$fail" "$rc"
            failed_lines+=("$name: $line (log: $out)")
            sed 's/^/    | /' "$out" | tail -n 15
        else
            printf 'ok   %-60s %3ss  (%s passed)\n' "$line" "$dt" "$pass"
        fi
    done <"$list"
}

case "$suite" in
    release) run_suite release build/release openmpi ;;
    asan) run_suite asan build/asan openmpi ;;
    mpich) run_suite mpich build/mpich mpich ;;
    emu)
        run_suite emu build/emu openmpi
        run_suite emu-tsan build/emu-tsan openmpi
        ;;
    gpu) run_suite gpu build/release openmpi ;;
    all)
        run_suite release build/release openmpi
        run_suite asan build/asan openmpi
        run_suite mpich build/mpich mpich
        run_suite emu build/emu openmpi
        run_suite emu-tsan build/emu-tsan openmpi
        ;;
    *) echo "run.sh: unknown suite $suite" >&2; exit 2 ;;
esac

echo
if [ ${#failed_lines[@]} -gt 0 ]; then
    echo "failed:"
    printf '  %s\n' "${failed_lines[@]}"
fi
if [ ${#skipped_lines[@]} -gt 0 ]; then
    echo "skipped (not counted as passed): $total_skip"
    printf '  %s\n' "${skipped_lines[@]}"
fi
echo "suite time: $(( $(date +%s) - t_start ))s"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ] && [ "$total_pass" -gt 0 ]
