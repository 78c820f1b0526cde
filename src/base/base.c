/*
 * base.c - the error buffer, logging, abort path, aligned allocation with
 * accounting, the clock and CRC-32C used by every layer of zr.
 *
 * zr runs one rank per process and single-threaded per rank, so the error
 * buffer and the allocation counters are plain process globals.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include "zr/base.h"

#include "zr/file.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
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
    [ZR_ERR_DEVICE] = "device error",
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

static size_t printable(char *out, size_t cap, const char *s, size_t n, int lines);

void zr_error_set_message(const char *msg)
{
    printable(err_msg, sizeof err_msg, msg ? msg : "", msg ? strlen(msg) : 0, 1);
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

void zr_error_save(zr_error_saved *s)
{
    _Static_assert(sizeof s->msg == sizeof err_msg, "a saved message is the whole buffer");
    memcpy(s->msg, err_msg, sizeof err_msg);
    s->agreed = err_agreed;
}

void zr_error_restore(const zr_error_saved *s)
{
    memcpy(err_msg, s->msg, sizeof err_msg);
    err_agreed = s->agreed;
}

/* Strip the directories so messages stay short: "src/comm/comm.c" -> "comm/comm.c". */
static const char *short_file(const char *file)
{
    const char *p = strstr(file, "src/");
    return p ? p + 4 : file;
}

/* The length of the valid UTF-8 sequence at s (n bytes left), 0 if none starts there. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t k = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (k == 0 || k > n || (s[0] >= 0xf8)) {
        return 0;
    }
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            return 0;
        }
    }
    /* no overlong three- and four-byte forms, no surrogates, nothing above U+10FFFF; and none
       of the characters that steer a terminal or reorder the line: C1 controls U+0080-009F,
       line and paragraph separators and bidirectional overrides U+2028-202E, U+2066-2069 */
    if ((k == 2 && s[0] == 0xc2 && s[1] < 0xa0) ||
        (k == 3 && s[0] == 0xe2 && s[1] == 0x80 && s[2] >= 0xa8 && s[2] <= 0xae) ||
        (k == 3 && s[0] == 0xe2 && s[1] == 0x81 && s[2] >= 0xa6 && s[2] <= 0xa9) ||
        (k == 3 && s[0] == 0xe0 && s[1] < 0xa0) || (k == 3 && s[0] == 0xed && s[1] >= 0xa0) ||
        (k == 4 && s[0] == 0xf0 && s[1] < 0x90) || (k == 4 && s[0] == 0xf4 && s[1] >= 0x90)) {
        return 0;
    }
    return k;
}

/* zr_str_printable, keeping newlines where lines is 1 (a message's own line breaks). */
static size_t printable(char *out, size_t cap, const char *s, size_t n, int lines)
{
    static const char more[] = "...";
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0, i = 0;
    if (cap == 0) {
        return 0;
    }
    while (i < n) {
        char esc[8];
        size_t k = u[i] >= 0x80 ? utf8_len(u + i, n - i) : 1, len;
        if ((u[i] >= 0x20 && u[i] < 0x7f) || (lines && u[i] == '\n')) {
            esc[0] = (char)u[i], len = 1;
        } else if (k > 1) {
            memcpy(esc, u + i, k), len = k;
        } else {
            k = 1;
            len = u[i] == '\n'   ? (size_t)snprintf(esc, sizeof esc, "\\n")
                  : u[i] == '\t' ? (size_t)snprintf(esc, sizeof esc, "\\t")
                                 : (size_t)snprintf(esc, sizeof esc, "\\x%02x", u[i]);
        }
        /* room for this piece, and for "..." after it unless it is the last (so that a cut
           always finds room for "..." where cap allows) */
        if (o + len + (i + k < n ? sizeof more - 1 : 0) > cap - 1) {
            size_t m = cap - 1 - o < sizeof more - 1 ? cap - 1 - o : sizeof more - 1;
            memcpy(out + o, more, m);
            o += m;
            break;
        }
        memcpy(out + o, esc, len);
        o += len, i += k;
    }
    out[o] = '\0';
    return o;
}

size_t zr_str_printable(char *out, size_t cap, const char *s, size_t n)
{
    return printable(out, cap, s, n, 0);
}

zr_status zr_error_at(zr_status st, const char *file, int line, const char *fmt, ...)
{
    /* formatted whole, made printable (a message may quote bytes read from a file: they are
       never printed raw), then cut in the middle if it must be: the start says what failed,
       the end says why, and a long path in between must not push the reason out */
    static char raw[4 * 4096 + 1024], body[4 * sizeof raw];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    size_t rlen = n < 0 ? 0 : (size_t)n < sizeof raw ? (size_t)n : sizeof raw - 1;
    size_t len = printable(body, sizeof body, raw, rlen, 1);
    if (len < sizeof err_msg) {
        memcpy(err_msg, body, len + 1);
    } else {
        size_t head = sizeof err_msg / 3, tail = sizeof err_msg - head - 8;
        snprintf(err_msg, sizeof err_msg, "%.*s [...] %s", (int)head, body, body + len - tail);
    }
    err_agreed = 0;
    zr_log_at(ZR_LOG_DEBUG, file, line, "error (%s): %s", zr_status_str(st), err_msg);
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

static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static zr_cpu_level cpu_cap = ZR_CPU_AVX512;

static void cpu_cap_once(void)
{
    const char *env = getenv("ZR_CPU");
    if (env == NULL || *env == '\0' || strcasecmp(env, "native") == 0) {
        return;
    }
    static const char *const names[] = {"sse2", "avx2", "avx512"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(env, names[i]) == 0) {
            cpu_cap = (zr_cpu_level)i;
            return;
        }
    }
    zr_die(__FILE__, __LINE__, "unset it, or give one of sse2, avx2, avx512, native",
           "ZR_CPU=%s is not an instruction set zr knows", env);
}

zr_cpu_level zr_cpu_cap(void)
{
    pthread_once(&cpu_once, cpu_cap_once);
    return cpu_cap;
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
    /* a launcher may act on the abort before it reads these lines: let it read them first */
    zr_file_drain_std(5.0);
    if (abort_hook != NULL) {
        abort_hook(1);
    }
    exit(1);
}

/* ---- allocation --------------------------------------------------------- */

/*
 * Every block carries a header in front of the aligned pointer holding its
 * size and the call site that asked for it, so that zr_free can keep the
 * accounting exact (in total and per site) without a table of blocks.
 *
 * Large blocks get their own anonymous mapping and go back to the kernel at
 * zr_free. Through malloc they would not: glibc raises its mmap threshold to
 * the size of every mapped block freed (up to 32 MB), after which blocks of
 * that size come from the heap, and a freed heap block in the middle of the
 * heap stays resident. The resident set would then keep the largest mix of
 * gathered units and gradient buffers ever seen instead of what is live now.
 * A fresh mapping is also zero already: its pages are touched (and counted by
 * the OS) only when written. Under AddressSanitizer blocks stay with malloc,
 * whose redzones catch overflows.
 */
typedef struct alloc_header {
    size_t bytes; /* accounted bytes (rounded request) */
    uint64_t magic;
    size_t map_len; /* length of the mapping that holds the block; 0: from malloc */
    int site;       /* index into sites[] */
    unsigned char pad[ZR_ALIGN - 3 * sizeof(size_t) - sizeof(int)];
} alloc_header;

_Static_assert(sizeof(alloc_header) == ZR_ALIGN, "allocation header must be one alignment unit");

#define ALLOC_MAGIC 0x7a72616c6c6f6321ull /* "zrallocc!" */

#ifdef ZR_ASAN
#define ALLOC_MMAP 0
#else
#define ALLOC_MMAP 1
#endif
/* Blocks from this size on get their own mapping. */
#define ALLOC_MMAP_MIN ((size_t)256 * 1024)

/* Call sites, hashed by (file, line); the last slot collects the overflow. */
#define MEM_SITES 256
static zr_mem_site sites[MEM_SITES], sites_at_peak[MEM_SITES];
static int sites_used, sites_at_peak_used;
static size_t mem_current, mem_peak;
static size_t mem_device_current, mem_device_peak;

static int site_index(const char *file, int line)
{
    uintptr_t h = ((uintptr_t)file >> 3) * 31u + (uintptr_t)line;
    for (int probe = 0; probe < MEM_SITES - 1; probe++) {
        int i = (int)((h + (uintptr_t)probe) % (MEM_SITES - 1));
        if (sites[i].file == NULL) {
            sites[i].file = short_file(file);
            sites[i].line = line;
            sites[i].key = file;
            sites_used = i + 1 > sites_used ? i + 1 : sites_used;
            return i;
        }
        if (sites[i].key == file && sites[i].line == line) {
            return i;
        }
    }
    sites[MEM_SITES - 1].file = "(other sites)";
    sites_used = MEM_SITES;
    return MEM_SITES - 1;
}

static void host_count(int site, size_t bytes)
{
    sites[site].bytes += bytes;
    sites[site].blocks++;
    mem_current += bytes;
    if (mem_current > mem_peak) {
        mem_peak = mem_current;
        memcpy(sites_at_peak, sites, sizeof(zr_mem_site) * (size_t)sites_used);
        sites_at_peak_used = sites_used;
    }
}

zr_status zr_alloc_at(void **out, size_t bytes, const char *file, int line)
{
    *out = NULL;
    if (bytes > SIZE_MAX / 2) {
        return zr_error_at(ZR_ERR_NOMEM, file, line,
                           "allocation of an impossible size requested at %s:%d", short_file(file),
                           line);
    }
    size_t rounded = zr_round_up(bytes == 0 ? 1 : bytes, ZR_ALIGN);
    size_t total = rounded + sizeof(alloc_header);
    void *raw = NULL;
    size_t map_len = 0;
    if (ALLOC_MMAP && total >= ALLOC_MMAP_MIN) {
        map_len = total;
        raw = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) {
            raw = NULL;
        }
    } else if (posix_memalign(&raw, ZR_ALIGN, total) == 0) {
        memset(raw, 0, total);
    } else {
        raw = NULL;
    }
    if (raw == NULL) {
        return zr_error_at(ZR_ERR_NOMEM, file, line, "out of memory allocating %zu bytes at %s:%d",
                           bytes, short_file(file), line);
    }
    alloc_header *h = raw;
    h->bytes = rounded;
    h->magic = ALLOC_MAGIC;
    h->map_len = map_len;
    h->site = site_index(file, line);
    host_count(h->site, rounded);
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
    sites[h->site].bytes -= h->bytes;
    sites[h->site].blocks--;
    if (h->map_len != 0) {
        munmap(h, h->map_len);
    } else {
        free(h);
    }
}

void zr_mem_count_at(zr_mem_pool pool, size_t bytes, int add, const char *file, int line)
{
    if (pool == ZR_MEM_DEVICE) {
        ZR_ASSERT(add || mem_device_current >= bytes);
        mem_device_current = add ? mem_device_current + bytes : mem_device_current - bytes;
        mem_device_peak =
            mem_device_current > mem_device_peak ? mem_device_current : mem_device_peak;
        return;
    }
    int site = site_index(file, line);
    if (add) {
        host_count(site, bytes);
        return;
    }
    ZR_ASSERT(mem_current >= bytes && sites[site].bytes >= bytes && sites[site].blocks > 0);
    mem_current -= bytes;
    sites[site].bytes -= bytes;
    sites[site].blocks--;
}

size_t zr_mem_device_current(void)
{
    return mem_device_current;
}

size_t zr_mem_device_peak(void)
{
    return mem_device_peak;
}

void zr_mem_device_peak_reset(void)
{
    mem_device_peak = mem_device_current;
}

size_t zr_mem_current(void)
{
    return mem_current;
}

size_t zr_mem_peak(void)
{
    return mem_peak;
}

static int site_cmp(const void *a, const void *b)
{
    const zr_mem_site *x = a, *y = b;
    return (x->bytes < y->bytes) - (x->bytes > y->bytes);
}

int zr_mem_sites(zr_mem_site *out, int max, int at_peak)
{
    const zr_mem_site *src = at_peak ? sites_at_peak : sites;
    int used = at_peak ? sites_at_peak_used : sites_used, n = 0;
    for (int i = 0; i < used && max > 0; i++) {
        if (src[i].file == NULL || src[i].bytes == 0) {
            continue;
        }
        if (n < max) {
            out[n++] = src[i];
        } else if (src[i].bytes > out[max - 1].bytes) {
            out[max - 1] = src[i]; /* replace the smallest kept so far */
        } else {
            continue;
        }
        qsort(out, (size_t)n, sizeof *out, site_cmp);
    }
    return n;
}

/* ---- clock and checksum ------------------------------------------------- */

double zr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double zr_median(double *v, int n)
{
    ZR_ASSERT(n > 0);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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

size_t zr_first_nonfinite(const float *x, size_t n)
{
    /* blocks of 256 with a branch-free test (all exponent bits set: NaN or infinity) that the
       compiler vectorizes; the index is looked for only in a block that has one */
    for (size_t a = 0; a < n; a += 256) {
        size_t m = n - a < 256 ? n - a : 256;
        uint32_t bad = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t b;
            memcpy(&b, &x[a + i], sizeof b);
            bad |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
        }
        for (size_t i = 0; bad && i < m; i++) {
            uint32_t b;
            memcpy(&b, &x[a + i], sizeof b);
            if ((b & 0x7f800000u) == 0x7f800000u) {
                return a + i;
            }
        }
    }
    return n;
}
