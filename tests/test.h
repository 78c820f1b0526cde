/*
 * test.h - zr's tiny test framework, header-only.
 *
 * A test is a void function run with TEST_RUN(fn). Checks record a failure
 * with file:line and go on, so one run reports every broken check. The
 * program ends with zr_test_finish(), which prints the closing line
 *     N passed, N failed
 * (counted in tests, not checks) and returns the exit status.
 *
 * Multi-rank programs call zr_test_mpi_init() first: then a test passes only
 * if it passed on every rank, failures are printed by the rank that saw them,
 * and only rank 0 prints the summary.
 */
#ifndef ZR_TEST_H
#define ZR_TEST_H

#include "zr/base.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZR_TEST_MPI
#include <mpi.h>
#endif

static int zr_test_failed_checks; /* in the current test, on this rank */
static int zr_test_checks;
static int zr_test_passed, zr_test_failed;
static int zr_test_rank = 0;
static int zr_test_mpi = 0;

static inline void zr_test_fail_(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline void zr_test_fail_(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (zr_test_mpi) {
        fprintf(stderr, "[rank %d] ", zr_test_rank);
    }
    fprintf(stderr, "  FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    zr_test_failed_checks++;
}

#define TEST_CHECK(cond)                                                                           \
    do {                                                                                           \
        zr_test_checks++;                                                                          \
        if (!(cond)) {                                                                             \
            zr_test_fail_(__FILE__, __LINE__, "%s", #cond);                                        \
        }                                                                                          \
    } while (0)

/* Like TEST_CHECK, with a printf-style explanation of the values. */
#define TEST_CHECKF(cond, ...)                                                                     \
    do {                                                                                           \
        zr_test_checks++;                                                                          \
        if (!(cond)) {                                                                             \
            zr_test_fail_(__FILE__, __LINE__, __VA_ARGS__);                                        \
        }                                                                                          \
    } while (0)

#define TEST_EQ_INT(a, b)                                                                          \
    do {                                                                                           \
        long long zr_a_ = (long long)(a), zr_b_ = (long long)(b);                                  \
        TEST_CHECKF(zr_a_ == zr_b_, "%s == %s (%lld vs %lld)", #a, #b, zr_a_, zr_b_);              \
    } while (0)

#define TEST_NEAR(a, b, tol)                                                                       \
    do {                                                                                           \
        double zr_a_ = (double)(a), zr_b_ = (double)(b), zr_t_ = (double)(tol);                    \
        TEST_CHECKF(fabs(zr_a_ - zr_b_) <= zr_t_, "%s ~ %s (%.9g vs %.9g, tol %.3g)", #a, #b,      \
                    zr_a_, zr_b_, zr_t_);                                                          \
    } while (0)

/* The call must succeed; on failure the recorded error message is shown. */
#define TEST_OK(call)                                                                              \
    do {                                                                                           \
        zr_status zr_s_ = (call);                                                                  \
        TEST_CHECKF(zr_s_ == ZR_OK, "%s -> %s: %s", #call, zr_status_str(zr_s_),                   \
                    zr_error_message());                                                           \
    } while (0)

/* The call must fail with the given status and a message containing substr. */
#define TEST_FAILS(call, status, substr)                                                           \
    do {                                                                                           \
        zr_error_clear();                                                                          \
        zr_status zr_s_ = (call);                                                                  \
        TEST_CHECKF(zr_s_ == (status), "%s -> %s, expected %s", #call, zr_status_str(zr_s_),       \
                    zr_status_str(status));                                                        \
        TEST_CHECKF(strstr(zr_error_message(), (substr)) != NULL,                                  \
                    "%s: message \"%s\" lacks \"%s\"", #call, zr_error_message(), (substr));       \
    } while (0)

static inline void zr_test_run_(const char *name, void (*fn)(void))
{
    /* ZR_TEST_ONLY=substring runs only the matching tests (while working on one) */
    const char *only = getenv("ZR_TEST_ONLY");
    if (only != NULL && only[0] != '\0' && strstr(name, only) == NULL) {
        return;
    }
    zr_test_failed_checks = 0;
    double t0 = zr_now();
    fn();
    int failed = zr_test_failed_checks != 0;
#ifdef ZR_TEST_MPI
    if (zr_test_mpi) {
        int any = 0;
        MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
        failed = any;
    }
#endif
    if (failed) {
        zr_test_failed++;
    } else {
        zr_test_passed++;
    }
    if (zr_test_rank == 0) {
        printf("%s %s (%.2fs)\n", failed ? "FAIL" : "ok  ", name, zr_now() - t0);
        fflush(stdout);
    }
}

#define TEST_RUN(fn) zr_test_run_(#fn, fn)

#ifdef ZR_TEST_MPI
static inline void zr_test_mpi_init(int *argc, char ***argv)
{
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &zr_test_rank);
    zr_test_mpi = 1;
}
#endif

/* Occurrences of needle in hay (a message said once, not once per rank). */
static inline int zr_test_count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *q = strstr(hay, needle); q != NULL; q = strstr(q + 1, needle)) {
        n++;
    }
    return n;
}

/*
 * Print the closing line; returns the process exit status. Memory that zr
 * allocated and never freed counts as one more failed test, so leaks are
 * caught even where LeakSanitizer cannot run (under mpirun).
 */
static inline int zr_test_finish(void)
{
    int leaked = zr_mem_current() != 0 || zr_mem_device_current() != 0;
    if (zr_mem_current() != 0) {
        fprintf(stderr, "[rank %d] FAIL leak check: %zu bytes allocated by zr never freed\n",
                zr_test_rank, zr_mem_current());
    }
    if (zr_mem_device_current() != 0) {
        fprintf(stderr, "[rank %d] FAIL leak check: %zu device bytes allocated by zr never freed\n",
                zr_test_rank, zr_mem_device_current());
    }
#ifdef ZR_TEST_MPI
    if (zr_test_mpi) {
        int any = 0;
        MPI_Allreduce(&leaked, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
        leaked = any;
    }
#endif
    if (leaked) {
        zr_test_failed++;
    }
    if (zr_test_rank == 0) {
        printf("%d passed, %d failed\n", zr_test_passed, zr_test_failed);
        fflush(stdout);
    }
#ifdef ZR_TEST_MPI
    if (zr_test_mpi) {
        MPI_Finalize();
    }
#endif
    return zr_test_failed == 0 ? 0 : 1;
}

/*
 * A program that cannot run here (no GPU, a build without CUDA) says so in
 * one line, "skipped: <why>", and closes with "0 passed, 0 failed": tests/run.sh
 * counts it as skipped, never as passed. Returns the exit status (0).
 */
static inline int zr_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static inline int zr_test_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (zr_test_rank == 0) {
        printf("skipped: ");
        vprintf(fmt, ap);
        printf("\n0 passed, 0 failed\n");
        fflush(stdout);
    }
    va_end(ap);
#ifdef ZR_TEST_MPI
    if (zr_test_mpi) {
        MPI_Finalize();
    }
#endif
    return 0;
}

/* Write bytes to a file (test fixtures); a failure is a failed check. */
static inline void zr_test_write_file(const char *path, const void *data, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f != NULL);
    if (f != NULL) {
        TEST_CHECK(fwrite(data, 1, bytes, f) == bytes);
        fclose(f);
    }
}

/* Deterministic xorshift generator for test data; same sequence on every machine. */
typedef struct zr_test_rng {
    uint64_t s;
} zr_test_rng;

static inline uint64_t zr_test_rng_next(zr_test_rng *r)
{
    uint64_t x = r->s ? r->s : 0x9e3779b97f4a7c15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    r->s = x;
    return x;
}

/* Uniform in [-1, 1). */
static inline float zr_test_rng_uniform(zr_test_rng *r)
{
    return (float)((double)(zr_test_rng_next(r) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* Standard normal (Box-Muller). */
static inline float zr_test_rng_normal(zr_test_rng *r)
{
    double u1 = ((double)(zr_test_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(zr_test_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif /* ZR_TEST_H */
