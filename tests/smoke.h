/*
 * smoke.h - run one opt-in smoke script (tests/<name>_smoke.sh) as a program
 * of the test runner, which only runs C programs from testlist. Used by
 * test_cluster (emulated cluster) and test_slurm (Slurm on that cluster).
 *
 * Opt-in: such a smoke needs root and network namespaces and builds a
 * cluster, so it runs only when the environment variable `optin` is "1". A
 * skip (not opted in, or the script exits 77: no root, no namespaces,
 * packages missing, cluster busy) prints "skipped: <reason>" and
 * "0 passed, 0 failed": a skip is not a pass. Otherwise the script's verdict
 * is one test: "1 passed, 0 failed" or "0 passed, 1 failed". The script gets
 * the zr of this build in ZR_BIN; its output is forwarded.
 */
#ifndef ZR_TEST_SMOKE_H
#define ZR_TEST_SMOKE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int zr_smoke_main(const char *optin, const char *script, const char *unavailable)
{
    const char *opt = getenv(optin);
    if (opt == NULL || strcmp(opt, "1") != 0) {
        printf("skipped: opt-in test, set %s=1 to run it (needs root)\n", optin);
        printf("0 passed, 0 failed\n");
        return 0;
    }
    /* build/<variant>/tests/test_x -> repository root and build/<variant>/zr */
    char self[4096], cmd[4096 + 4200 + 128];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "cannot find myself\n");
        printf("0 passed, 1 failed\n");
        return 1;
    }
    self[n] = '\0';
    char *variant = self, *slash;
    for (int up = 0; up < 2; up++) { /* strip "/test_x", "/tests" */
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
    snprintf(cmd, sizeof cmd, "ZR_BIN='%s' '%s/tests/%s' 2>&1", zr, self, script);
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
        fflush(stdout);
        char *sk = strstr(line, "skipped: ");
        if (sk != NULL && reason[0] == '\0') { /* the first one names the cause */
            snprintf(reason, sizeof reason, "%s", sk + strlen("skipped: "));
            reason[strcspn(reason, "\n")] = '\0';
        }
    }
    int st = pclose(p);
    int rc = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc == 77) {
        printf("skipped: %s\n", reason[0] != '\0' ? reason : unavailable);
        printf("0 passed, 0 failed\n");
        return 0;
    }
    if (rc == 0) {
        printf("1 passed, 0 failed\n");
        return 0;
    }
    fprintf(stderr, "%s exited with %d\n", script, rc);
    printf("0 passed, 1 failed\n");
    return 1;
}

#endif
