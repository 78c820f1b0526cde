/*
 * test_slurm.c - zr under Slurm on the emulated cluster (tests/slurm_smoke.sh:
 * srun training, resume, SIGTERM at a job's time limit, resume) as a program
 * of the test runner: opt-in with ZR_SLURM_SMOKE=1 (root, network namespaces,
 * Debian's Slurm packages, ~2 min); a skip prints "skipped: <reason>" and
 * counts as neither pass nor fail (tests/smoke.h).
 */
#define _GNU_SOURCE
#include "smoke.h"

int main(void)
{
    return zr_smoke_main("ZR_SLURM_SMOKE", "slurm_smoke.sh",
                         "Slurm on the emulated cluster unavailable");
}
