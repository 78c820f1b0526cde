#!/bin/sh
# bench/peers/run.sh - zr ZeRO-3 against PyTorch FSDP2 and DeepSpeed ZeRO-3 on the CPU: the same
# GPT (L 4, C 256, T 256, V 256), 2 ranks x 1 thread, fp32, AdamW, interleaved reps.
# Usage: bench/peers/run.sh [peers.py options: --reps N --steps N --systems zr,fsdp,ds --json ...]
# Needs: make (build/release/zr), mpirun, and pip install torch deepspeed (bench/peers/README.md).
# PYTHON=/path/to/python picks the interpreter that has torch (default python3).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
. scripts/mpienv.sh
exec "${PYTHON:-python3}" "$here/peers.py" "$@"
