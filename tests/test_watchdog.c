/*
 * test_watchdog.c - bounded waits and launch agreement, end to end under a
 * real launcher (mpirun.openmpi, or mpiexec.mpich for the MPICH build):
 *
 *   - a rank that stalls: every waiting rank reports which collective waits
 *     for which rank, and the job ends with a non-zero status (the watchdog);
 *   - a rank that fails while the others wait for it: they stop at once with
 *     its message (the abort notice), long before the timeout;
 *   - the same two through zr train (ZR_FAULT_STEP), mid-step;
 *   - a failure notice sent for the next agreement while a slower rank is
 *     still inside the current one: kept for the next, never a hang;
 *   - MPMD launches whose ranks got different flags, ZR_RANKS_PER_NODE or
 *     data files: exit status 2 and one message naming keys, values, ranks.
 *
 * Run directly (one process): it launches the jobs itself, including copies
 * of itself in child mode (--child SCENARIO) for the communicator-level cases.
 * A job that hangs is killed by timeout(1) after 120 s and fails its check.
 */
#define _DEFAULT_SOURCE /* mkdtemp, readlink */
#define ZR_TEST_MPI
#include "test.h"

#include "zr/comm.h"

#include <libgen.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* paths in this test are short; a truncated one would fail its check loudly
 * (gcc only: clang has no such warning and rejects its name) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static char self[4096], zr_bin[4096], work[4096];
static int mpich;

#define TINY                                                                                       \
    " --layers 1 --channels 32 --heads 2 --seq-len 32 --micro-batch 2 --val-every 0"               \
    " --steps_per_print 1000 --warmup 2 --steps 4"

static struct {
    int code;
    char out[1 << 16];
} res;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Run a shell command, capturing stdout and stderr together. */
static int sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[8400];
    snprintf(full, sizeof full, "(%s) 2>&1 </dev/null", cmd);
    FILE *p = popen(full, "r");
    if (p == NULL) {
        res.code = -1;
        return -1;
    }
    size_t n = fread(res.out, 1, sizeof res.out - 1, p);
    res.out[n] = '\0';
    int st = pclose(p);
    res.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return res.code;
}

/* The launcher with a per-job environment: "-x A=1" or "-genv A 1". */
static const char *launcher(void)
{
    return mpich ? "mpiexec.mpich" : "mpirun.openmpi";
}

static void env_flag(char *buf, size_t n, const char *name, const char *value, int global)
{
    if (mpich) {
        snprintf(buf, n, "%s %s %s", global ? "-genv" : "-env", name, value);
    } else {
        snprintf(buf, n, "-x %s=%s", name, value);
    }
}

#define OUT_HAS(s)                                                                                 \
    TEST_CHECKF(strstr(res.out, (s)) != NULL, "output lacks \"%s\":\n%s", (s), res.out)

static int count_of(const char *s)
{
    return zr_test_count(res.out, s);
}

/* ---- child mode: the communicator under a fault ----------------------------------- */

static _Noreturn void stall(void)
{
    for (;;) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
}

/*
 * The "early" scenario holds one rank inside an agreement, after its exchange
 * and before it takes in the notices, until another rank has left the
 * agreement and sent its next notice. MPI's profiling interface makes that a
 * wrapper: this program's MPI_Testsome is the one libzr.a (linked into it)
 * calls, and the library's own is PMPI_Testsome.
 */
static int hold_armed; /* the next MPI_Testsome that completes its set waits ... */
static int hold_for;   /* ... for this world rank's message (tag HOLD_TAG on world) */
#define HOLD_TAG 99

int MPI_Testsome(int incount, MPI_Request array_of_requests[], int *outcount,
                 int array_of_indices[], MPI_Status array_of_statuses[])
{
    int rc =
        PMPI_Testsome(incount, array_of_requests, outcount, array_of_indices, array_of_statuses);
    if (hold_armed && rc == MPI_SUCCESS && *outcount == MPI_UNDEFINED) {
        hold_armed = 0;
        int x = 0;
        PMPI_Recv(&x, 1, MPI_INT, hold_for, HOLD_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        /* the notice went out before that message, on another communicator */
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return rc;
}

/*
 * Rank 1 fails and every rank agrees on it; then each notifies (as zr train
 * did after any failed step) and they agree again. Rank 2 is held inside the
 * first agreement until rank 0 has left it and notified: rank 0's notice
 * belongs to the second agreement, which must count it.
 */
static void early_notice(zr_comm *c)
{
    int R = c->rank[ZR_GROUP_WORLD];
    zr_status st = ZR_OK;
    if (R == 1) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "disk full while writing x.bin");
    }
    if (R == 2) {
        hold_for = 0;
        hold_armed = 1;
    }
    st = zr_comm_agree(c, st);
    zr_comm_notify(c, st);
    if (R == 0) {
        int x = 1;
        MPI_Send(&x, 1, MPI_INT, 2, HOLD_TAG, MPI_COMM_WORLD);
    }
    st = zr_comm_agree(c, st);
    printf("rank %d agreed twice: %s: %s\n", R, zr_status_str(st), zr_error_message());
    fflush(stdout);
}

static int child(const char *scenario)
{
    MPI_Init(NULL, NULL);
    zr_comm c;
    ZR_TRY(zr_comm_init(&c, MPI_COMM_WORLD, NULL), "");
    int R = c.rank[ZR_GROUP_WORLD], W = c.size[ZR_GROUP_WORLD];
    int64_t mine = R, all[16];
    MPI_Barrier(MPI_COMM_WORLD); /* everyone is up: the waits below start together */
    if (strcmp(scenario, "early") == 0) {
        early_notice(&c);
        zr_comm_free(&c);
        MPI_Finalize();
        return 0;
    }
    if (strcmp(scenario, "stall") == 0) {
        if (R == 1) {
            stall();
        }
        (void)zr_comm_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &mine, sizeof mine, all);
    } else if (strcmp(scenario, "barrier") == 0) {
        if (R == W - 1) {
            stall();
        }
        (void)zr_comm_barrier(&c);
    } else if (strcmp(scenario, "fail") == 0) {
        /* rank 1 takes part in the first exchange and fails right after it: its notice may
         * arrive before its data, yet the first exchange completes everywhere */
        zr_status st =
            zr_comm_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &mine, sizeof mine, all);
        if (R == 0) {
            printf("first exchange: %s\n", zr_status_str(st));
        }
        if (R == 1) {
            st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "disk full while writing x.bin");
            zr_comm_notify(&c, st);
        } else {
            /* waits for rank 1, which never sends */
            st = zr_comm_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &mine, sizeof mine, all);
            if (R == 0) {
                printf("rank 0 stopped waiting: %s\n", zr_status_str(st));
            }
        }
        st = zr_comm_agree(&c, st);
        if (R == 0) {
            printf("agreed: %s: %s (broken %d)\n", zr_status_str(st), zr_error_message(),
                   zr_comm_broken(&c));
            fflush(stdout);
        }
        zr_comm_abort(&c, 3);
    }
    /* not reached when the watchdog works */
    printf("rank %d: the wait returned\n", R);
    zr_comm_free(&c);
    MPI_Finalize();
    return 0;
}

static int run_child(int np, const char *scenario, const char *timeout)
{
    char e1[128];
    env_flag(e1, sizeof e1, "ZR_TIMEOUT", timeout, 1);
    return sh("timeout -k 5 120 %s -n %d %s %s --child %s", launcher(), np, e1, self, scenario);
}

static void test_stalled_rank(void)
{
    run_child(3, "stall", "2");
    TEST_CHECKF(res.code != 0 && res.code != 124 && res.code != 137, "exit %d", res.code);
    OUT_HAS("timeout: no progress for");
    OUT_HAS("in allgather (group world of 3 ranks");
    /* both waiting ranks say whom they wait for */
    TEST_CHECKF(count_of("waiting for data from rank 1") >= 2, "%s", res.out);
    TEST_CHECK(strstr(res.out, "the wait returned") == NULL);

    run_child(3, "barrier", "2");
    TEST_CHECKF(res.code != 0 && res.code != 124 && res.code != 137, "exit %d", res.code);
    OUT_HAS("in barrier (group world");
    OUT_HAS("waiting for the other ranks of group world");
}

static void test_failing_rank(void)
{
    /* the timeout is far beyond the 120 s the job is given: only the notice can end it */
    run_child(3, "fail", "1000");
    TEST_EQ_INT(res.code, 3);
    OUT_HAS("first exchange: ok");
    OUT_HAS("rank 0 stopped waiting: failure on another rank");
    OUT_HAS("agreed: I/O error: rank 1: disk full while writing x.bin (broken 1)");
}

/*
 * Issue 39 item 1: a notice sent after a rank left an agreement reached a
 * rank still inside it, which counted it there; the next agreement then
 * waited for it forever (until the watchdog: 2 of 8 zr train runs whose save
 * failed on one rank with ENOSPC).
 */
static void test_early_notice(void)
{
    run_child(3, "early", "10");
    TEST_EQ_INT(res.code, 0);
    TEST_CHECKF(count_of("agreed twice: I/O error: rank 1: disk full while writing x.bin") == 3,
                "%s", res.out);
    TEST_CHECKF(strstr(res.out, "timeout") == NULL, "%s", res.out);
}

/* ---- zr train ----------------------------------------------------------------------- */

static void test_train_faults(void)
{
    char e[128];
    env_flag(e, sizeof e, "ZR_FAULT_STEP", "1:2:stall", 1);
    sh("timeout -k 5 120 %s -n 3 %s %s train" TINY " --timeout 2", launcher(), e, zr_bin);
    TEST_EQ_INT(res.code, 1);
    OUT_HAS("ZR_FAULT_STEP: stalling at step 2");
    OUT_HAS("timeout: no progress for");
    OUT_HAS("step 2,");
    OUT_HAS("waiting for data from rank 1");
    OUT_HAS("zr.train.timeout_s");

    /* the default timeout (300 s) is beyond the job's 120 s. The line saying why the job died
       must reach the user every time: MPICH's mpiexec acted on MPI_Abort before it had read
       the ranks' last lines (lost in 2 of 7 runs under load) until zr_comm_abort waited for
       them to be read; run it several times, where it was lost. 20 runs (under 1 s each): zr
       before the fix lost it in 25 of 155 runs on a loaded 2-core machine, and 5 runs let the
       test pass on it 3 times in 8 (docs/hardening-verification.md) */
    env_flag(e, sizeof e, "ZR_FAULT_STEP", "2:3", 1);
    int reps = mpich ? 20 : 2, lost = 0;
    static char lost_out[sizeof res.out];
    for (int r = 0; r < reps; r++) {
        sh("timeout -k 5 120 %s -n 3 %s %s train" TINY, launcher(), e, zr_bin);
        TEST_EQ_INT(res.code, 1);
        if (strstr(res.out, "zr train: error: rank 2: fault injected by ZR_FAULT_STEP at step 3") ==
            NULL) {
            if (lost++ == 0) {
                memcpy(lost_out, res.out, sizeof lost_out); /* the output that lost it */
            }
        }
        TEST_CHECK(strstr(res.out, "timeout: no progress") == NULL);
    }
    TEST_CHECKF(lost == 0, "the error line was lost in %d of %d runs; the first:\n%s", lost, reps,
                lost_out);
}

static void test_mpmd_config(void)
{
    const char *L = launcher();
    sh("timeout -k 5 120 %s -n 1 %s train" TINY " --stage 3 : -n 1 %s train" TINY " --stage 1", L,
       zr_bin, zr_bin);
    TEST_EQ_INT(res.code, 2);
    OUT_HAS("ranks were started with different configurations");
    OUT_HAS("zero_optimization.stage is 3 on rank 0, 1 on rank 1");
    TEST_EQ_INT(count_of("zr train: error:"), 1);

    sh("timeout -k 5 120 %s -n 2 %s train" TINY " : -n 1 %s train" TINY " --steps 9", L, zr_bin,
       zr_bin);
    TEST_EQ_INT(res.code, 2);
    OUT_HAS("zr.train.train_steps is 4 on ranks 0-1, 9 on rank 2");

    char e1[128], e2[128];
    env_flag(e1, sizeof e1, "ZR_RANKS_PER_NODE", "1", 0);
    env_flag(e2, sizeof e2, "ZR_RANKS_PER_NODE", "2", 0);
    sh("timeout -k 5 120 %s -n 1 %s %s train" TINY " : -n 1 %s %s train" TINY, L, e1, zr_bin, e2,
       zr_bin);
    TEST_EQ_INT(res.code, 2);
    OUT_HAS("ranks were started with different ZR_RANKS_PER_NODE: '1' on rank 0, '2' on rank 1");
    TEST_CHECK(strstr(res.out, "bug in zr") == NULL);
}

static void test_mpmd_data(void)
{
    /* the same relative path names different files in the ranks' working directories */
    char a[4400], b[4400], f[4500];
    snprintf(a, sizeof a, "%s/a", work);
    snprintf(b, sizeof b, "%s/b", work);
    TEST_EQ_INT(sh("mkdir -p %s %s", a, b), 0);
    static char text[20000];
    for (size_t i = 0; i < sizeof text; i++) {
        text[i] = (char)('a' + i * 7 % 26);
    }
    snprintf(f, sizeof f, "%s/corpus.txt", a);
    zr_test_write_file(f, text, sizeof text);
    text[sizeof text - 1] = '!';
    snprintf(f, sizeof f, "%s/corpus.txt", b);
    zr_test_write_file(f, text, sizeof text);
    sh("timeout -k 5 120 %s -n 1 -wdir %s %s train" TINY " --data corpus.txt : -n 1 -wdir %s %s "
       "train" TINY " --data corpus.txt",
       launcher(), a, zr_bin, b, zr_bin);
    TEST_EQ_INT(res.code, 2);
    OUT_HAS("ranks read different training data from corpus.txt");
    OUT_HAS("CRC-32C");
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0) {
        return child(argv[2]);
    }
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "test_watchdog: cannot find its own path\n");
        return 1;
    }
    self[n] = '\0';
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", self);
    char *tests_dir = dirname(tmp); /* build/<variant>/tests */
    snprintf(zr_bin, sizeof zr_bin, "%s/../zr", tests_dir);
    mpich = strstr(self, "mpich") != NULL;
    snprintf(work, sizeof work, "/tmp/zr_watchdog_XXXXXX");
    if (mkdtemp(work) == NULL) {
        fprintf(stderr, "test_watchdog: cannot create a temporary folder\n");
        return 1;
    }
    /* the jobs' own processes: no leak reports from the MPI runtime, no progress bar */
    setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0:halt_on_error=1", 1);
    setenv("ZR_PROGRESS", "0", 1);
    unsetenv("ZR_RANKS_PER_NODE");
    unsetenv("ZR_FAULT_STEP");
    unsetenv("ZR_TIMEOUT");
    TEST_RUN(test_stalled_rank);
    TEST_RUN(test_failing_rank);
    TEST_RUN(test_early_notice);
    TEST_RUN(test_train_faults);
    TEST_RUN(test_mpmd_config);
    TEST_RUN(test_mpmd_data);
    sh("rm -rf %s", work);
    return zr_test_finish();
}
