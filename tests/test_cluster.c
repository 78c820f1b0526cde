/*
 * test_cluster.c - the emulated-cluster smoke test (tests/cluster_smoke.sh)
 * as a program of the test runner, which only runs C programs from testlist.
 *
 * Opt-in: the smoke needs root and network namespaces, builds a 2-node
 * cluster and takes ~5 s, so it runs only when ZR_CLUSTER_SMOKE=1. A skip
 * (not opted in, or the script exits 77: no root, no namespaces, cluster
 * busy) prints "skipped: <reason>" and "0 passed, 0 failed": a skip is not a
 * pass. Otherwise the script's verdict is one test: "1 passed, 0 failed" or
 * "0 passed, 1 failed".
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    (void)argc;
    const char *opt = getenv("ZR_CLUSTER_SMOKE");
    if (opt == NULL || strcmp(opt, "1") != 0) {
        printf("skipped: opt-in test, set ZR_CLUSTER_SMOKE=1 to run it (needs root)\n");
        printf("0 passed, 0 failed\n");
        return 0;
    }
    /* build/<variant>/tests/test_cluster -> repository root and build/<variant>/zr */
    char self[4096], cmd[4096 + 4200 + 128];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "cannot find myself (%s)\n", argv[0]);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    self[n] = '\0';
    char *variant = self, *slash;
    for (int up = 0; up < 2; up++) { /* strip "/test_cluster", "/tests" */
        if ((slash = strrchr(self, '/')) != NULL) {
            *slash = '\0';
        }
    }
    char zr[4200];
    snprintf(zr, sizeof zr, "%s/zr", variant);
    for (int up = 0; up < 2; up++) { /* strip "/<variant>", "/build" */
        if ((slash = strrchr(self, '/')) != NULL) {
            *slash = '\0';
        }
    }
    snprintf(cmd, sizeof cmd, "ZR_BIN='%s' '%s/tests/cluster_smoke.sh' 2>&1", zr, self);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        fprintf(stderr, "cannot run %s\n", cmd);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    char line[1024], reason[1024] = "";
    while (fgets(line, sizeof line, p) != NULL) {
        fputs(line, stdout); /* forward the script's report */
        char *sk = strstr(line, "skipped: ");
        if (sk != NULL && reason[0] == '\0') { /* the first one names the cause */
            snprintf(reason, sizeof reason, "%s", sk + strlen("skipped: "));
            reason[strcspn(reason, "\n")] = '\0';
        }
    }
    int st = pclose(p);
    int rc = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc == 77) {
        printf("skipped: %s\n", reason[0] != '\0' ? reason : "emulated cluster unavailable");
        printf("0 passed, 0 failed\n");
        return 0;
    }
    if (rc == 0) {
        printf("1 passed, 0 failed\n");
        return 0;
    }
    fprintf(stderr, "cluster_smoke.sh exited with %d\n", rc);
    printf("0 passed, 1 failed\n");
    return 1;
}
