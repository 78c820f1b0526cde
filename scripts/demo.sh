#!/bin/sh
# demo.sh - the README's main job: 4 ranks laid out as 2 emulated nodes.
set -eu
cd "$(dirname "$0")/.."
. scripts/mpienv.sh
exec mpirun.openmpi -np 4 -x ZR_RANKS_PER_NODE=2 build/release/zr selfcheck
