/*
 * test_cluster.c - the emulated-cluster smoke test (tests/cluster_smoke.sh)
 * as a program of the test runner: opt-in with ZR_CLUSTER_SMOKE=1 (root,
 * network namespaces, ~5 s); a skip prints "skipped: <reason>" and counts as
 * neither pass nor fail (tests/smoke.h).
 */
#define _GNU_SOURCE
#include "smoke.h"

int main(void)
{
    return zr_smoke_main("ZR_CLUSTER_SMOKE", "cluster_smoke.sh", "emulated cluster unavailable");
}
