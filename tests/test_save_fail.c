/*
 * test_save_fail.c - a failure anywhere ends every rank at once (issue 39
 * item 1), end to end: zr train at 4 ranks as 2 nodes x 2 under mpirun.
 *
 *   - every stage of a save on every rank (ZR_FAULT_SAVE=k@N:R:fail: rank 0
 *     reaches stages 1-9, the others 1-3), a step on every rank
 *     (ZR_FAULT_STEP=R:S) and the final save of the shutdown: each run exits
 *     1 with the failing rank's message, printed once, never through the
 *     watchdog; the previous checkpoint still verifies, nothing is left in
 *     step_N.partial, and a step_N that exists verifies too;
 *   - a save that fails with "No space left on device" (a 3.7 MB tmpfs:
 *     root; skipped otherwise), several times in a row: it hung 2 runs in 8
 *     before (a failure notice counted in the wrong agreement).
 *
 * Run directly (one process): it launches the jobs itself, a few side by
 * side. --enospc-runs N repeats the full-disk case N times (default 2; the
 * issue's acceptance runs it 20 times). A job that hangs is killed by
 * timeout(1) after 120 s and fails its check (the watchdog's default is 300 s).
 */
#define _DEFAULT_SOURCE /* mkdtemp, readlink */
#include "test.h"

#include "zr/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* paths in this test are short; a truncated one would fail its check loudly
 * (gcc only: clang has no such warning and rejects its name) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static char zr_bin[4096], work[4096];
static int mpich;

/* a checkpoint every 2 steps, the last two kept: a fault in the save of step 6 finds 4 intact */
#define TINY                                                                                       \
    " --layers 1 --channels 32 --heads 2 --seq-len 32 --micro-batch 2 --val-every 0"               \
    " --steps_per_print 1000 --warmup 2 --steps 8 --ckpt-every 2 --zr.checkpoint.keep 2"

enum { OUT_MAX = 1 << 16, PAR_RUNS = 3 };

typedef struct job {
    char cmd[8192];
    int code;
    char out[OUT_MAX];
} job;

/* The exit status of a shell as an exit code (128 + signal when killed). */
static int exit_code(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Read what a job wrote into file (stdout and stderr together). */
static void read_output(const char *file, job *j)
{
    FILE *f = fopen(file, "r");
    j->out[0] = '\0';
    if (f != NULL) {
        size_t n = fread(j->out, 1, sizeof j->out - 1, f);
        j->out[n] = '\0';
        fclose(f);
    }
    unlink(file);
}

/* Run the jobs' commands, PAR_RUNS at a time; each gets its own Open MPI session folder. */
static void run_all(job *jobs, int n)
{
    pid_t pid[PAR_RUNS] = {0};
    int slot_of[PAR_RUNS] = {0};
    int next = 0, running = 0;
    while (next < n || running > 0) {
        if (next < n && running < PAR_RUNS) {
            int s = 0;
            while (pid[s] != 0) {
                s++;
            }
            static int launches; /* over every call: a session folder per launch */
            char file[4200], tmp[4200];
            snprintf(file, sizeof file, "%s/job_%d.out", work, next);
            snprintf(tmp, sizeof tmp, "%s/ompi_%d", work, launches++);
            pid_t c = fork();
            if (c == 0) {
                int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                int in = open("/dev/null", O_RDONLY);
                if (fd < 0 || in < 0 || dup2(fd, 1) < 0 || dup2(1, 2) < 0 || dup2(in, 0) < 0 ||
                    mkdir(tmp, 0700) != 0 || setenv("OMPI_MCA_orte_tmpdir_base", tmp, 1) != 0) {
                    _exit(126);
                }
                execl("/bin/sh", "sh", "-c", jobs[next].cmd, (char *)NULL);
                _exit(127);
            }
            TEST_CHECKF(c > 0, "fork: %s", strerror(errno));
            if (c < 0) {
                return;
            }
            pid[s] = c;
            slot_of[s] = next++;
            running++;
            continue;
        }
        int st = 0;
        pid_t done = wait(&st);
        for (int s = 0; s < PAR_RUNS && done > 0; s++) {
            if (pid[s] == done) {
                char file[4200];
                snprintf(file, sizeof file, "%s/job_%d.out", work, slot_of[s]);
                jobs[slot_of[s]].code = exit_code(st);
                read_output(file, &jobs[slot_of[s]]);
                pid[s] = 0;
                running--;
            }
        }
        if (done < 0) {
            break;
        }
    }
}

/* "zr train" at 4 ranks as 2 x 2 with env (NAME=VALUE or "") and the checkpoint folder dir. */
static void train_cmd(job *j, const char *env, const char *dir, const char *extra)
{
    char e[256] = "";
    if (env[0] != '\0') {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(strchr(env, '=') - env), env);
        if (mpich) {
            snprintf(e, sizeof e, "-genv %s %s", name, strchr(env, '=') + 1);
        } else {
            snprintf(e, sizeof e, "-x %s", env);
        }
    }
    snprintf(j->cmd, sizeof j->cmd,
             "timeout -k 5 120 %s %s 4 %s ZR_RANKS_PER_NODE%s2 %s %s train%s --ckpt-dir %s",
             mpich ? "mpiexec.mpich" : "mpirun.openmpi", mpich ? "-n" : "-np",
             mpich ? "-genv" : "-x", mpich ? " " : "=", e, zr_bin, extra, dir);
}

/* Entries of dir whose name contains pattern; -1 when dir cannot be read. */
static int count_entries(const char *dir, const char *pattern)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return -1;
    }
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        n += strstr(ent->d_name, pattern) != NULL;
    }
    closedir(d);
    return n;
}

/* The checkpoint of step under dir verifies (1), is absent (0), or is there and damaged (-1). */
static int ckpt_state(const char *dir, int step)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/step_%08d", dir, step);
    struct stat sb;
    if (stat(p, &sb) != 0) {
        return 0;
    }
    zr_status st = zr_ckpt_verify(p);
    if (st != ZR_OK) {
        printf("  %s: %s\n", p, zr_error_message());
    }
    return st == ZR_OK ? 1 : -1;
}

/* The checks every failed run passes: exit 1, its message once, no timeout, previous intact. */
static void check_failed_run(const job *j, const char *name, const char *dir, const char *expect,
                             int prev)
{
    TEST_CHECKF(j->code == 1, "%s: exit %d (124/137: hung)\n%s", name, j->code, j->out);
    TEST_CHECKF(zr_test_count(j->out, expect) == 1, "%s: \"%s\" not printed once:\n%s", name,
                expect, j->out);
    TEST_CHECKF(strstr(j->out, "timeout: no progress") == NULL, "%s: the watchdog ended it:\n%s",
                name, j->out);
    TEST_CHECKF(ckpt_state(dir, prev) == 1, "%s: the previous checkpoint (step %d) is not intact",
                name, prev);
    TEST_CHECKF(count_entries(dir, ".partial") == 0, "%s: a step_N.partial was left", name);
}

typedef struct fault_case {
    const char *env; /* ZR_FAULT_SAVE=... or ZR_FAULT_STEP=... */
    int rank;        /* the failing rank, named in the message */
    int step;        /* the step whose save or step fails */
    int stage;       /* the save stage; 0: a step */
} fault_case;

static void test_fault_every_stage(void)
{
    /* rank 0: every stage; ranks 1-3: the stages they reach; steps on every rank; the final
       save of the shutdown on two ranks */
    static fault_case cases[32];
    static char envs[32][64];
    int n = 0;
    for (int r = 0; r < 4; r++) {
        for (int k = 1; k <= (r == 0 ? 9 : 3); k++) {
            snprintf(envs[n], sizeof envs[n], "ZR_FAULT_SAVE=%d@6:%d:fail", k, r);
            cases[n] = (fault_case){envs[n], r, 6, k};
            n++;
        }
        snprintf(envs[n], sizeof envs[n], "ZR_FAULT_STEP=%d:5", r);
        cases[n] = (fault_case){envs[n], r, 5, 0};
        n++;
    }
    snprintf(envs[n], sizeof envs[n], "ZR_FAULT_SAVE=2@8:3:fail");
    cases[n] = (fault_case){envs[n], 3, 8, 2};
    n++;
    snprintf(envs[n], sizeof envs[n], "ZR_FAULT_SAVE=9@8:0:fail");
    cases[n] = (fault_case){envs[n], 0, 8, 9};
    n++;
    static job jobs[32];
    char dir[4400];
    for (int i = 0; i < n; i++) {
        snprintf(dir, sizeof dir, "%s/case%d", work, i);
        train_cmd(&jobs[i], cases[i].env, dir, TINY);
    }
    run_all(jobs, n);
    for (int i = 0; i < n; i++) {
        const fault_case *f = &cases[i];
        char expect[256];
        if (f->stage > 0) {
            snprintf(expect, sizeof expect,
                     "zr train: error: rank %d: fault injected by %s: save stage %d of step %d "
                     "failed",
                     f->rank, f->env, f->stage, f->step);
        } else {
            snprintf(expect, sizeof expect,
                     "zr train: error: rank %d: fault injected by ZR_FAULT_STEP at step %d",
                     f->rank, f->step);
        }
        snprintf(dir, sizeof dir, "%s/case%d", work, i);
        int prev = f->step == 8 ? 6 : 4;
        check_failed_run(&jobs[i], f->env, dir, expect, prev);
        /* the failed save's checkpoint: absent until rank 0's rename (stage 6; a failure on
           another rank at stage 3 meets rank 0 committing), complete after */
        int now = f->stage > 0 ? ckpt_state(dir, f->step) : 0;
        if (f->rank == 0 ? f->stage < 6 : f->stage < 3) {
            TEST_CHECKF(now == 0, "%s: step %d stands after a save that failed before its rename",
                        f->env, f->step);
        } else {
            TEST_CHECKF(now >= 0, "%s: step %d stands damaged", f->env, f->step);
        }
    }
    printf("  %d faults (saves at every stage on every rank, steps, the final save): each ended "
           "the job with its message\n",
           n);
}

static int enospc_runs = 2;

/* A save that runs out of space on a 3.7 MB tmpfs (the case), enospc_runs times. */
static void test_enospc_repeated(void)
{
    char mnt[4400], dir[4500], extra[512];
    snprintf(mnt, sizeof mnt, "%s/small", work);
    TEST_CHECK(mkdir(mnt, 0755) == 0);
    snprintf(extra, sizeof extra,
             " --layers 1 --channels 64 --heads 2 --seq-len 32 --micro-batch 2 --val-every 0"
             " --steps 20 --ckpt-every 5");
    snprintf(dir, sizeof dir, "%s/c", mnt);
    job *j = calloc(1, sizeof *j);
    TEST_CHECK(j != NULL);
    for (int i = 0; j != NULL && i < enospc_runs; i++) {
        snprintf(j->cmd, sizeof j->cmd, "mount -t tmpfs -o size=3700k tmpfs %s", mnt);
        run_all(j, 1);
        if (j->code != 0) {
            printf("  skipped: a small tmpfs needs root (%s)\n", j->out);
            break;
        }
        train_cmd(j, "", dir, extra);
        run_all(j, 1);
        char name[64];
        snprintf(name, sizeof name, "ENOSPC run %d", i + 1);
        check_failed_run(j, name, dir, "No space left on device", 10);
        TEST_CHECKF(strstr(j->out, "zr train: error: rank ") != NULL, "%s:\n%s", name, j->out);
        snprintf(j->cmd, sizeof j->cmd, "umount %s", mnt);
        run_all(j, 1);
        TEST_CHECKF(j->code == 0, "umount %s: %s", mnt, j->out);
        if (i + 1 == enospc_runs && zr_test_failed_checks == 0) {
            printf("  %d runs, each ended at once with the message\n", enospc_runs);
        }
    }
    free(j);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--enospc-runs") == 0 && i + 1 < argc) {
            enospc_runs = (int)strtol(argv[++i], &end, 10);
        }
        if (end == NULL || *end != '\0' || enospc_runs < 0) {
            fprintf(stderr, "usage: test_save_fail [--enospc-runs N]\n");
            return 2;
        }
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "test_save_fail: cannot find its own path\n");
        return 1;
    }
    self[n] = '\0';
    mpich = strstr(self, "mpich") != NULL;
    snprintf(zr_bin, sizeof zr_bin, "%s/../zr", dirname(self)); /* build/<variant>/tests */
    snprintf(work, sizeof work, "/tmp/zr_save_fail_XXXXXX");
    if (mkdtemp(work) == NULL) {
        fprintf(stderr, "test_save_fail: cannot create a temporary folder\n");
        return 1;
    }
    /* the jobs' own processes: no leak reports from the MPI runtime, no progress bar */
    setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0:halt_on_error=1", 1);
    setenv("ZR_PROGRESS", "0", 1);
    unsetenv("ZR_RANKS_PER_NODE");
    unsetenv("ZR_FAULT_STEP");
    unsetenv("ZR_FAULT_SAVE");
    unsetenv("ZR_TIMEOUT");
    TEST_RUN(test_fault_every_stage);
    TEST_RUN(test_enospc_repeated);
    if (zr_test_failed == 0) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf %s", work);
        job *j = calloc(1, sizeof *j);
        if (j != NULL) {
            snprintf(j->cmd, sizeof j->cmd, "%s", cmd);
            run_all(j, 1);
            free(j);
        }
    } else {
        printf("work directory kept: %s\n", work);
    }
    return zr_test_finish();
}
