/*
 * zr/base.h - status codes, error propagation, logging, assertions and
 * allocation shared by every layer of zr.
 *
 * Two tiers of error handling (see README "Errors"):
 *   - library functions return zr_status; the first place that detects a
 *     failure records a message with ZR_FAIL, every caller on the way up
 *     propagates with ZR_CHECK (which leaves a file:line breadcrumb at debug
 *     level);
 *   - programs turn a bad status into an abort with rank, file:line and a
 *     hint (ZR_TRY / zr_die).
 * ZR_ASSERT is always on: it guards cheap invariants whose failure is a bug
 * in zr, never a user error.
 *
 * Nothing here depends on MPI, so the quantization layer and single-process
 * tests can use it without a communicator.
 */
#ifndef ZR_BASE_H
#define ZR_BASE_H

#include <stddef.h>
#include <stdint.h>

/* C++ (the .cu files, which g++ compiles in the GPU emulator build) sees C
 * linkage */
#ifdef __cplusplus
extern "C" {
#endif

typedef enum zr_status {
    ZR_OK = 0,
    ZR_ERR_INVALID,   /* bad argument, config value or layout */
    ZR_ERR_NOMEM,     /* allocation failed */
    ZR_ERR_IO,        /* open/read/write/fsync/rename failed */
    ZR_ERR_FORMAT,    /* corrupt, truncated or foreign file or wire block */
    ZR_ERR_MPI,       /* the transport reported an error */
    ZR_ERR_NONFINITE, /* Inf or NaN where a finite value is required */
    ZR_ERR_REMOTE,    /* another rank failed; its message is ours now */
    ZR_ERR_INTERNAL,  /* a bug in zr */
    ZR_ERR_DEVICE,    /* the GPU, its driver or runtime failed, or there is none (zr/device.h) */
    ZR_STATUS_COUNT
} zr_status;

/* Short constant name of a status ("invalid argument", ...). */
const char *zr_status_str(zr_status st);

/*
 * The message of the most recent failure recorded by ZR_FAIL in this process
 * ("" if none). Owned by zr; valid until the next failure is recorded.
 */
const char *zr_error_message(void);

/*
 * s (n bytes, which may come from any file) made fit for a message in out
 * (cap bytes, terminated): printable ASCII and valid UTF-8 as they are, a
 * newline and a tab as \n and \t, every other byte as \xNN; cut with "..."
 * where it would not fit. Every recorded error message passes through it
 * (keeping the message's own line breaks).
 * Returns the length written.
 */
size_t zr_str_printable(char *out, size_t cap, const char *s, size_t n);

/* Replace the recorded message (used when ranks agree on one error). */
void zr_error_set_message(const char *msg);

/*
 * An agreed message: one that every rank holds and that already names the
 * rank it came from ("rank 3: ..."). zr_comm_agree records its result with
 * zr_error_set_agreed and, when asked to agree on an error whose message is
 * agreed already, passes it on unchanged, so a message never gains a second
 * "rank R: " however many layers agree on it. A new failure (zr_error_at,
 * zr_error_set_message, zr_error_clear) resets the mark.
 */
void zr_error_set_agreed(const char *msg);
int zr_error_agreed(void);

/* Clear the recorded message (tests that provoke errors on purpose). */
void zr_error_clear(void);

/*
 * The error buffer kept aside across work that may fail and clear it on its
 * own (a clean-up after a failure: its own misses must not replace the
 * failure the caller is about to report).
 */
typedef struct zr_error_saved {
    char msg[1024];
    int agreed;
} zr_error_saved;
void zr_error_save(zr_error_saved *s);
void zr_error_restore(const zr_error_saved *s);

/*
 * Record a failure: formats "file:line: message" into the error buffer, logs
 * it at debug level and returns st so that ZR_FAIL can be used in a return.
 */
zr_status zr_error_at(zr_status st, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Breadcrumb left by ZR_CHECK when a call fails; logs at debug level only. */
void zr_error_trace(zr_status st, const char *file, int line, const char *expr);

#define ZR_FAIL(st, ...) return zr_error_at((st), __FILE__, __LINE__, __VA_ARGS__)

/* Propagate a failing status to the caller. */
#define ZR_CHECK(call)                                                                             \
    do {                                                                                           \
        zr_status zr_st_ = (call);                                                                 \
        if (zr_st_ != ZR_OK) {                                                                     \
            zr_error_trace(zr_st_, __FILE__, __LINE__, #call);                                     \
            return zr_st_;                                                                         \
        }                                                                                          \
    } while (0)

/* Same, for functions that hold resources: store the status and jump. */
#define ZR_CHECK_GOTO(call, st, label)                                                             \
    do {                                                                                           \
        (st) = (call);                                                                             \
        if ((st) != ZR_OK) {                                                                       \
            zr_error_trace((st), __FILE__, __LINE__, #call);                                       \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/*
 * Record a failure like ZR_FAIL, but store its status in st and jump to the
 * cleanup label instead of returning, for functions that hold resources.
 */
#define ZR_FAIL_GOTO(st, label, code, ...)                                                         \
    do {                                                                                           \
        (st) = zr_error_at((code), __FILE__, __LINE__, __VA_ARGS__);                               \
        goto label;                                                                                \
    } while (0)

/* ---- logging ------------------------------------------------------------ */

typedef enum zr_log_level {
    ZR_LOG_ERROR = 0,
    ZR_LOG_WARN = 1,
    ZR_LOG_INFO = 2,
    ZR_LOG_DEBUG = 3
} zr_log_level;

/*
 * The rank printed in every log line and abort message; -1 (the default)
 * prints no rank. The communicator sets it; single-process programs need not.
 */
void zr_log_set_rank(int rank);

/* Level from ZR_DEBUG=error|warn|info|debug (default warn), read once. */
zr_log_level zr_log_level_get(void);
void zr_log_level_set(zr_log_level level);

void zr_log_at(zr_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define ZR_WARN(...)  zr_log_at(ZR_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define ZR_INFO(...)  zr_log_at(ZR_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define ZR_DEBUG(...) zr_log_at(ZR_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

/* ---- aborting ----------------------------------------------------------- */

/*
 * Print "[zr rank R] fatal at file:line: <message>" plus an optional hint and
 * terminate the whole job (through the abort hook the communicator installs,
 * MPI_Abort; plain abort() otherwise). Never returns.
 */
void zr_die(const char *file, int line, const char *hint, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));

/* Installed by the communicator so that zr_die takes every rank down. */
void zr_set_abort_hook(void (*hook)(int exit_code));

/* In programs: a failing call ends the job with its message and a hint. */
#define ZR_TRY(call, hint)                                                                         \
    do {                                                                                           \
        zr_status zr_st_ = (call);                                                                 \
        if (zr_st_ != ZR_OK) {                                                                     \
            zr_die(__FILE__, __LINE__, (hint), "%s: %s", zr_status_str(zr_st_),                    \
                   zr_error_message());                                                            \
        }                                                                                          \
    } while (0)

/* Always-on invariant check; a failure is a bug in zr. */
#define ZR_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            zr_die(__FILE__, __LINE__, "this is a bug in zr; please report it",                    \
                   "assertion failed: %s", #cond);                                                 \
        }                                                                                          \
    } while (0)

/* ---- memory ------------------------------------------------------------- */

/* Alignment of every zr allocation: one cache line, enough for AVX-512. */
#define ZR_ALIGN 64

/*
 * Allocate bytes (rounded up to ZR_ALIGN) aligned to ZR_ALIGN and zero them.
 * On failure records a message naming file:line and the size, and returns
 * ZR_ERR_NOMEM with *out = NULL. A request of 0 bytes yields a valid pointer.
 * Free with zr_free. The caller owns the memory. Blocks of 256 KB and more
 * are mapped on their own and returned to the OS by zr_free (base.c says why).
 */
zr_status zr_alloc_at(void **out, size_t bytes, const char *file, int line);
void zr_free(void *ptr);

/* Bytes currently allocated through zr_alloc_at in this process, and the peak. */
size_t zr_mem_current(void);
size_t zr_mem_peak(void);

/*
 * Memory zr obtains outside zr_alloc_at (zr/device.h), counted all the same:
 * pinned host memory with the host bytes above (zr_mem_current, its site in
 * zr_mem_sites), device memory apart (zr_mem_device_current). add is 1 when
 * the bytes are obtained, 0 when they are released; file:line names the site
 * that obtained them in both calls.
 */
typedef enum zr_mem_pool {
    ZR_MEM_HOST = 0,
    ZR_MEM_DEVICE = 1,
} zr_mem_pool;
void zr_mem_count_at(zr_mem_pool pool, size_t bytes, int add, const char *file, int line);

/* Device bytes currently allocated by zr in this process (every GPU), and the peak. */
size_t zr_mem_device_current(void);
size_t zr_mem_device_peak(void);
/* Start the peak again from what is held now (a new run in the same process). */
void zr_mem_device_peak_reset(void);

/*
 * Bytes held per allocation site (file:line of the zr_alloc_at call), to see
 * where memory goes. Fills out with up to max sites, largest first, holding
 * bytes now (at_peak = 0) or at the moment of the peak (at_peak = 1); returns
 * the count. Sites beyond the first 255 distinct ones are summed in one entry.
 */
typedef struct zr_mem_site {
    const char *file; /* short name ("zero/engine.c") */
    int line;
    size_t bytes, blocks;
    const void *key; /* private */
} zr_mem_site;
int zr_mem_sites(zr_mem_site *out, int max, int at_peak);

/*
 * ZR_ALLOC(p, n): p = zeroed array of n elements of *p, or return ZR_ERR_NOMEM.
 * ZR_ALLOC_GOTO(p, n, st, label): the same in a function that holds
 * resources: store the status in st and jump to its cleanup label.
 * ZR_ALLOC_STATUS(p, n): the same allocation as an expression giving its
 * status, for code that must go on after a failure (a status chain before a
 * call every rank makes) and for programs (ZR_TRY).
 * Every allocation of zr goes through these, so that zr_mem_sites names the
 * line that allocated; CONTRIBUTING.md says when zr_alloc_at is called
 * directly.
 */
#define ZR_ALLOC_STATUS(ptr, count)                                                                \
    zr_alloc_at((void **)&(ptr), zr_mul_size_((count), sizeof *(ptr)), __FILE__, __LINE__)
#define ZR_ALLOC(ptr, count)                 ZR_CHECK(ZR_ALLOC_STATUS(ptr, count))
#define ZR_ALLOC_GOTO(ptr, count, st, label) ZR_CHECK_GOTO(ZR_ALLOC_STATUS(ptr, count), st, label)

/* count * size, saturating to SIZE_MAX so that an overflow fails to allocate. */
static inline size_t zr_mul_size_(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size) {
        return SIZE_MAX;
    }
    return count * size;
}

/* ---- small helpers ------------------------------------------------------ */

static inline size_t zr_round_up(size_t x, size_t m)
{
    return (x + m - 1) / m * m;
}

static inline size_t zr_div_up(size_t x, size_t m)
{
    return (x + m - 1) / m;
}

/* Monotonic wall clock in seconds. */
double zr_now(void);

/* The median of v[0..n-1], n >= 1 (of an even count, the mean of the two middle values: the
   upper one alone leans towards the slower half of a set of timings). Sorts v. */
double zr_median(double *v, int n);

/*
 * The widest x86 vector instructions zr's kernels may use, whatever the CPU
 * has: the environment's ZR_CPU (sse2, avx2, avx512; unset or native: no
 * cap), read once. A cap runs the narrower kernels on a wider CPU: their
 * tests, and a measurement as an AVX2 machine would run it. Any other value
 * ends the job with a message (every rank reads the same environment).
 */
typedef enum { ZR_CPU_SSE2 = 0, ZR_CPU_AVX2 = 1, ZR_CPU_AVX512 = 2 } zr_cpu_level;
zr_cpu_level zr_cpu_cap(void);

/* CRC-32C (Castagnoli) of a byte range, chainable: pass the previous value as crc. */
uint32_t zr_crc32c(uint32_t crc, const void *data, size_t bytes);

/*
 * Index of the first NaN or infinity among x[0..n), n when every value is
 * finite. One pass over the floats, cheap enough to run on each buffer as it
 * is read or written (the readers of checkpoints and model files do).
 */
size_t zr_first_nonfinite(const float *x, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* ZR_BASE_H */
