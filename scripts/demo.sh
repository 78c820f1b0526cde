#!/bin/sh
# demo.sh - the README's main job: zr train with its built-in defaults, a
# small GPT on the bundled corpus (Debian's fortunes) with ZeRO++ on, on 4
# ranks laid out as 2 emulated nodes of 2 ranks.
set -eu
cd "$(dirname "$0")/.."
. scripts/mpienv.sh
exec mpirun.openmpi -np 4 -x ZR_RANKS_PER_NODE=2 build/release/zr train "$@"
