/*
 * base.c - the error buffer, logging, abort path, aligned allocation with
 * accounting, the clock and CRC-32C used by every layer of zr.
 *
 * zr runs one rank per process and single-threaded per rank, so the error
 * buffer and the allocation counters are plain process globals.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ASan (gcc defines __SANITIZE_ADDRESS__, clang has __has_feature) */
#if defined(__SANITIZE_ADDRESS__)
#define ZR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZR_ASAN 1
#endif
#endif
#ifdef ZR_ASAN
#include <sanitizer/asan_interface.h>
#endif

static char err_msg[1024];
static int err_agreed; /* err_msg already names the rank it came from (zr_comm_agree) */
static int log_rank = -1;
static int log_level = -1; /* -1: not read from the environment yet */
static void (*abort_hook)(int exit_code);

static const char *const status_names[ZR_STATUS_COUNT] = {
    [ZR_OK] = "ok",
    [ZR_ERR_INVALID] = "invalid argument",
    [ZR_ERR_NOMEM] = "out of memory",
    [ZR_ERR_IO] = "I/O error",
    [ZR_ERR_FORMAT] = "bad format",
    [ZR_ERR_MPI] = "MPI error",
    [ZR_ERR_NONFINITE] = "non-finite value",
    [ZR_ERR_REMOTE] = "failure on another rank",
    [ZR_ERR_INTERNAL] = "internal error",
};

const char *zr_status_str(zr_status st)
{
    if ((unsigned)st >= ZR_STATUS_COUNT) {
        return "unknown status";
    }
    return status_names[st];
}

const char *zr_error_message(void)
{
    return err_msg;
}

void zr_error_set_message(const char *msg)
{
    snprintf(err_msg, sizeof err_msg, "%s", msg ? msg : "");
    err_agreed = 0;
}

void zr_error_set_agreed(const char *msg)
{
    zr_error_set_message(msg);
    err_agreed = 1;
}

int zr_error_agreed(void)
{
    return err_agreed;
}

void zr_error_clear(void)
{
    err_msg[0] = '\0';
    err_agreed = 0;
}

/* Strip the directories so messages stay short: "src/comm/comm.c" -> "comm/comm.c". */
static const char *short_file(const char *file)
{
    const char *p = strstr(file, "src/");
    return p ? p + 4 : file;
}

zr_status zr_error_at(zr_status st, const char *file, int line, const char *fmt, ...)
{
    char body[sizeof err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    /* The message is what the user reads; the location is for us. */
    snprintf(err_msg, sizeof err_msg, "%s", body);
    err_agreed = 0;
    zr_log_at(ZR_LOG_DEBUG, file, line, "error (%s): %s", zr_status_str(st), body);
    return st;
}

void zr_error_trace(zr_status st, const char *file, int line, const char *expr)
{
    zr_log_at(ZR_LOG_DEBUG, file, line, "-> %s from %s", zr_status_str(st), expr);
}

void zr_log_set_rank(int rank)
{
    log_rank = rank;
}

int zr_log_rank(void)
{
    return log_rank;
}

zr_log_level zr_log_level_get(void)
{
    if (log_level < 0) {
        const char *env = getenv("ZR_DEBUG");
        log_level = ZR_LOG_WARN;
        if (env != NULL) {
            static const char *const names[] = {"error", "warn", "info", "debug"};
            for (int i = 0; i < 4; i++) {
                if (strcasecmp(env, names[i]) == 0) {
                    log_level = i;
                }
            }
        }
    }
    return (zr_log_level)log_level;
}

void zr_log_level_set(zr_log_level level)
{
    log_level = (int)level;
}

static void print_prefix(FILE *f, const char *tag, const char *file, int line)
{
    if (log_rank >= 0) {
        fprintf(f, "[zr rank %d] %s %s:%d: ", log_rank, tag, short_file(file), line);
    } else {
        fprintf(f, "[zr] %s %s:%d: ", tag, short_file(file), line);
    }
}

void zr_log_at(zr_log_level level, const char *file, int line, const char *fmt, ...)
{
    static const char *const tags[] = {"error", "warning", "info", "debug"};
    if (level > zr_log_level_get()) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    print_prefix(stderr, tags[level], file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void zr_set_abort_hook(void (*hook)(int exit_code))
{
    abort_hook = hook;
}

_Noreturn void zr_die(const char *file, int line, const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    print_prefix(stderr, "fatal", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (hint != NULL && hint[0] != '\0') {
        fprintf(stderr, "  hint: %s\n", hint);
    }
    fflush(stderr);
    fflush(stdout);
    if (abort_hook != NULL) {
        abort_hook(1);
    }
    exit(1);
}

/* ---- allocation --------------------------------------------------------- */

/*
 * Every block carries a header in front of the aligned pointer holding its
 * size, so that zr_free can keep the accounting exact without a table.
 */
typedef struct alloc_header {
    size_t bytes;
    uint64_t magic;
    unsigned char pad[ZR_ALIGN - sizeof(size_t) - sizeof(uint64_t)];
} alloc_header;

_Static_assert(sizeof(alloc_header) == ZR_ALIGN, "allocation header must be one alignment unit");

#define ALLOC_MAGIC 0x7a72616c6c6f6321ull /* "zrallocc!" */

static size_t mem_current, mem_peak;

zr_status zr_alloc_at(void **out, size_t bytes, const char *file, int line)
{
    *out = NULL;
    size_t rounded = zr_round_up(bytes == 0 ? 1 : bytes, ZR_ALIGN);
    if (bytes > SIZE_MAX - 2 * ZR_ALIGN) {
        return zr_error_at(ZR_ERR_NOMEM, file, line,
                           "allocation of an impossible size requested at %s:%d",
                           short_file(file), line);
    }
    void *raw = NULL;
    if (posix_memalign(&raw, ZR_ALIGN, rounded + sizeof(alloc_header)) != 0) {
        return zr_error_at(ZR_ERR_NOMEM, file, line, "out of memory allocating %zu bytes at %s:%d",
                           bytes, short_file(file), line);
    }
    memset(raw, 0, rounded + sizeof(alloc_header));
    alloc_header *h = raw;
    h->bytes = rounded;
    h->magic = ALLOC_MAGIC;
    mem_current += rounded;
    if (mem_current > mem_peak) {
        mem_peak = mem_current;
    }
    *out = (unsigned char *)raw + sizeof(alloc_header);
#ifdef ZR_ASAN
    /* the rounding is the allocator's, not the caller's: a read past the
       bytes asked for is an overflow that ASan must report, as with malloc */
    ASAN_POISON_MEMORY_REGION((unsigned char *)*out + bytes, rounded - bytes);
#endif
    return ZR_OK;
}

void zr_free(void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    alloc_header *h = (alloc_header *)((unsigned char *)ptr - sizeof(alloc_header));
    ZR_ASSERT(h->magic == ALLOC_MAGIC);
    h->magic = 0;
    mem_current -= h->bytes;
#ifdef ZR_ASAN
    ASAN_UNPOISON_MEMORY_REGION(ptr, h->bytes);
#endif
    free(h);
}

size_t zr_mem_current(void)
{
    return mem_current;
}

size_t zr_mem_peak(void)
{
    return mem_peak;
}

void zr_mem_reset_peak(void)
{
    mem_peak = mem_current;
}

/* ---- clock and checksum ------------------------------------------------- */

double zr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Table-driven CRC-32C, reflected polynomial 0x82F63B78; the table is built on first use. */
static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        crc_table[i] = c;
    }
    crc_ready = 1;
}

uint32_t zr_crc32c(uint32_t crc, const void *data, size_t bytes)
{
    if (!crc_ready) {
        crc_init();
    }
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < bytes; i++) {
        crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    }
    return ~crc;
}
