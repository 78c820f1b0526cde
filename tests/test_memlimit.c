/*
 * test_memlimit.c - the point of ZeRO under a per-rank memory limit: with
 * RLIMIT_AS set for every rank, zr train refuses stage 0 up front (on every
 * rank, "needs N GB, limit M GB", before the model or the engine allocate)
 * and trains the same model at stage 3 over 4 ranks.
 *
 * Model: L=12 C=768 (85 M parameters), T=16, B=1, one step. Per rank at 4
 * ranks zr states (measured): stage 0 needs 1.88 GB of address space, stage
 * 3 1.27 GB, each with the 0.30 GB an Open MPI rank has mapped before the
 * model. The limit of 1.5 GB sits between the two with room on both sides.
 * What a rank maps before the model is checked too (under 0.6 GB): CUDA's
 * libraries mapped at start-up (0.9 GB more, before zr opened them at their
 * first use, src/base/cudalib.h) would squeeze stage 3 out of the limit.
 */
#define _DEFAULT_SOURCE /* setenv */

#include "test.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static char zr_path[4096];

/* Run mpirun -np 4 zr train --stage S ... under RLIMIT_AS = limit; output into out. */
static int run_limited(int stage, rlim_t limit, char *out, size_t n)
{
    char tmpl[] = "/tmp/zr-memlimit-XXXXXX";
    int fd = mkstemp(tmpl);
    TEST_CHECK(fd >= 0);
    if (fd < 0) {
        return -1;
    }
    char st[8];
    snprintf(st, sizeof st, "%d", stage);
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
               "--micro-batch", "1", "--seq-len", "16", "--steps", "1", "--val-every", "0",
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

/* The "N GB mapped before the model" of a run's output, or -1. */
static double mapped_gb(const char *out)
{
    const char *at = strstr(out, "(RLIMIT_AS; ");
    double gb = -1;
    if (at == NULL || sscanf(at, "(RLIMIT_AS; %lf GB mapped", &gb) != 1) {
        return -1;
    }
    return gb;
}

static void test_stage0_refused_stage3_trains(void)
{
    static char out[1 << 16];
    const rlim_t limit = (rlim_t)1500 * 1000 * 1000;
    int rc = run_limited(0, limit, out, sizeof out);
    TEST_CHECKF(rc != 0, "stage 0 under a 1.5 GB limit exited %d", rc);
    TEST_CHECKF(strstr(out, "needs ") != NULL &&
                    strstr(out, "GB, limit 1.50 GB (RLIMIT_AS") != NULL,
                "no 'needs N GB, limit M GB' refusal:\n%s", out);
    TEST_CHECKF(strstr(out, "memory: predicted peak per rank") != NULL, "no prediction:\n%s", out);
    TEST_CHECKF(strstr(out, "out of memory allocating") == NULL && strstr(out, "step ") == NULL,
                "stage 0 got as far as allocating or training:\n%s", out);
    double mapped = mapped_gb(out);
    TEST_CHECKF(mapped > 0 && mapped < 0.6,
                "a rank maps %.2f GB before the model (CUDA's libraries at start-up?):\n%s", mapped,
                out);
    rc = run_limited(3, limit, out, sizeof out);
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
