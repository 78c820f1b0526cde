/*
 * test_memlimit.c - the point of ZeRO under a per-rank memory limit: with
 * RLIMIT_AS set for every rank, zr train refuses stage 0 up front (on every
 * rank, "needs N GB, limit M GB", before the model or the engine allocate)
 * and trains the same model at stage 3 over 4 ranks.
 *
 * Model: L=12 C=768 (85 M parameters), T=16, B=1, one step. Predicted per
 * rank at 4 ranks: stage 0 about 1.65 GB (16 bytes per parameter), stage 3
 * about 1.04 GB, plus what a rank has mapped before the model (~0.3 GB for
 * Open MPI, ~0.8 GB more for CUDA's libraries where the build links them).
 * Each stage's need is read from a run under a roomy limit (--steps 0: set-up only), and the limit
 * is set half way between the two.
 */
#define _DEFAULT_SOURCE /* setenv */

#include "test.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static char zr_path[4096];

/* Run mpirun -np 4 zr train --stage S --steps N ... under RLIMIT_AS = limit; output into out. */
static int run_limited(int stage, int steps, rlim_t limit, char *out, size_t n)
{
    char tmpl[] = "/tmp/zr-memlimit-XXXXXX";
    int fd = mkstemp(tmpl);
    TEST_CHECK(fd >= 0);
    if (fd < 0) {
        return -1;
    }
    char st[8], sp[8];
    snprintf(st, sizeof st, "%d", stage);
    snprintf(sp, sizeof sp, "%d", steps);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {limit, limit};
        if (setrlimit(RLIMIT_AS, &rl) != 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) {
            _exit(126);
        }
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) {
            dup2(devnull, 0);
        }
        execlp("timeout", "timeout", "-k", "5", "300", "mpirun.openmpi", "-np", "4", zr_path,
               "train", "--stage", st, "--layers", "12", "--channels", "768", "--heads", "12",
               "--micro-batch", "1", "--seq-len", "16", "--steps", sp, "--val-every", "0",
               "--device", "cpu", (char *)NULL);
        _exit(127);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    ssize_t got = pread(fd, out, n - 1, 0);
    out[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(tmpl);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* "needs N GB of address space" from a run's output, or -1. */
static double needs_gb(const char *out)
{
    const char *at = strstr(out, "memory: needs ");
    double gb = -1;
    if (at == NULL || sscanf(at, "memory: needs %lf GB", &gb) != 1) {
        return -1;
    }
    return gb;
}

static void test_stage0_refused_stage3_trains(void)
{
    static char out[1 << 16];
    /* What each stage needs under a limit far above it: the libraries a build
       links (CUDA's are ~0.8 GB of address space) count against RLIMIT_AS as
       much as the model, so the limit is placed between the two needs. */
    const rlim_t roomy = (rlim_t)1 << 40;
    int rc = run_limited(0, 0, roomy, out, sizeof out);
    double need0 = needs_gb(out);
    TEST_CHECKF(rc == 0 && need0 > 0, "stage 0 under a 1 TB limit exited %d:\n%s", rc, out);
    rc = run_limited(3, 0, roomy, out, sizeof out);
    double need3 = needs_gb(out);
    TEST_CHECKF(rc == 0 && need3 > 0, "stage 3 under a 1 TB limit exited %d:\n%s", rc, out);
    /* stage 0 holds 16 bytes per parameter, stage 3 over 4 ranks about a quarter */
    TEST_CHECKF(need0 - need3 > 0.4, "stage 0 needs %.2f GB, stage 3 %.2f GB", need0, need3);
    if (need0 <= 0 || need3 <= 0) {
        return;
    }
    const rlim_t limit = (rlim_t)((need0 + need3) / 2 * 1e9);
    char limit_text[64];
    snprintf(limit_text, sizeof limit_text, "GB, limit %.2f GB (RLIMIT_AS", (double)limit / 1e9);
    rc = run_limited(0, 1, limit, out, sizeof out);
    TEST_CHECKF(rc != 0, "stage 0 under a %.2f GB limit exited %d", (double)limit / 1e9, rc);
    TEST_CHECKF(strstr(out, "needs ") != NULL && strstr(out, limit_text) != NULL,
                "no 'needs N GB, limit M GB' refusal:\n%s", out);
    TEST_CHECKF(strstr(out, "memory: predicted peak per rank") != NULL, "no prediction:\n%s", out);
    TEST_CHECKF(strstr(out, "out of memory allocating") == NULL && strstr(out, "step ") == NULL,
                "stage 0 got as far as allocating or training:\n%s", out);
    rc = run_limited(3, 1, limit, out, sizeof out);
    TEST_CHECKF(rc == 0 && strstr(out, "done: 1 step in") != NULL,
                "stage 3 under the same limit exited %d:\n%s", rc, out);
}

int main(int argc, char **argv)
{
    (void)argc;
    /* build/<variant>/tests/test_memlimit -> build/<variant>/zr */
    snprintf(zr_path, sizeof zr_path, "%s", argv[0]);
    char *slash = strrchr(zr_path, '/');
    if (slash != NULL) {
        *slash = '\0';
    } else {
        snprintf(zr_path, sizeof zr_path, ".");
    }
    size_t len = strlen(zr_path);
    snprintf(zr_path + len, sizeof zr_path - len, "/../zr");
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    setenv("ZR_PROGRESS", "0", 0);
    TEST_RUN(test_stage0_refused_stage3_trains);
    return zr_test_finish();
}
