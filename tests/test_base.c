/*
 * test_base.c - the base layer: status strings, the error buffer and
 * ZR_CHECK propagation, allocation accounting and alignment, CRC-32C, the
 * thread pool.
 */
#include "test.h"
#include "zr/pool.h"

static zr_status fails_invalid(int x)
{
    if (x < 0) {
        ZR_FAIL(ZR_ERR_INVALID, "x must be >= 0, got %d", x);
    }
    return ZR_OK;
}

static zr_status propagates(int x)
{
    ZR_CHECK(fails_invalid(x));
    return ZR_OK;
}

static void test_status_and_messages(void)
{
    TEST_CHECK(strcmp(zr_status_str(ZR_OK), "ok") == 0);
    TEST_CHECK(strcmp(zr_status_str((zr_status)999), "unknown status") == 0);
    TEST_OK(propagates(3));
    TEST_FAILS(propagates(-7), ZR_ERR_INVALID, "x must be >= 0, got -7");
    zr_error_clear();
    TEST_CHECK(zr_error_message()[0] == '\0');
}

static zr_status alloc_some(float **out, size_t n)
{
    float *p;
    ZR_ALLOC(p, n);
    *out = p;
    return ZR_OK;
}

static void test_alloc(void)
{
    size_t before = zr_mem_current();
    float *p = NULL;
    TEST_OK(alloc_some(&p, 1000));
    TEST_CHECK(p != NULL);
    TEST_EQ_INT((uintptr_t)p % ZR_ALIGN, 0);
    int zero = 1;
    for (int i = 0; i < 1000; i++) {
        zero &= p[i] == 0.0f;
    }
    TEST_CHECK(zero);
    TEST_EQ_INT(zr_mem_current() - before, zr_round_up(1000 * sizeof(float), ZR_ALIGN));
    TEST_CHECK(zr_mem_peak() >= zr_mem_current());
    zr_free(p);
    TEST_EQ_INT(zr_mem_current(), before);
    /* an impossible size fails with a message instead of crashing */
    TEST_FAILS(alloc_some(&p, SIZE_MAX / 2), ZR_ERR_NOMEM, "alloc");
    TEST_CHECK(p == NULL || p != NULL); /* p untouched on failure is fine either way */
}

/* Large blocks (own mapping) are zeroed, counted and returned like small ones; sites name them. */
static void test_alloc_large_and_sites(void)
{
    size_t before = zr_mem_current();
    /* 3 MiB above the peak so far, so that this block makes a new peak */
    size_t bytes = (zr_mem_peak() - before) + ((size_t)3 << 20);
    unsigned char *big = NULL;
    int line = __LINE__ + 1;
    TEST_OK(zr_alloc_at((void **)&big, bytes, __FILE__, line));
    TEST_EQ_INT((uintptr_t)big % ZR_ALIGN, 0);
    int zero = 1;
    for (size_t i = 0; i < bytes; i += 4096) {
        zero &= big[i] == 0;
        big[i] = 1;
    }
    TEST_CHECK(zero);
    TEST_EQ_INT(zr_mem_current() - before, bytes);
    TEST_EQ_INT(zr_mem_peak(), zr_mem_current());
    zr_mem_site top[4];
    int n = zr_mem_sites(top, 4, 0);
    TEST_CHECK(n >= 1);
    TEST_CHECKF(n >= 1 && top[0].line == line && strstr(top[0].file, "test_base.c") != NULL &&
                    top[0].bytes == bytes && top[0].blocks == 1,
                "largest site %s:%d", n >= 1 ? top[0].file : "-", n >= 1 ? top[0].line : 0);
    zr_free(big);
    TEST_EQ_INT(zr_mem_current(), before);
    /* the peak snapshot still has the block; the live table does not */
    n = zr_mem_sites(top, 4, 1);
    TEST_CHECK(n >= 1 && top[0].line == line);
    n = zr_mem_sites(top, 4, 0);
    TEST_CHECK(n == 0 || top[0].line != line);
}

static void test_crc32c(void)
{
    /* the standard check value of CRC-32C */
    TEST_EQ_INT(zr_crc32c(0, "123456789", 9), 0xE3069283u);
    /* chaining equals one pass */
    uint32_t a = zr_crc32c(0, "12345", 5);
    TEST_EQ_INT(zr_crc32c(a, "6789", 4), 0xE3069283u);
    TEST_EQ_INT(zr_crc32c(0, "", 0), 0);
}

static void test_helpers(void)
{
    TEST_EQ_INT(zr_round_up(0, 8), 0);
    TEST_EQ_INT(zr_round_up(9, 8), 16);
    TEST_EQ_INT(zr_div_up(9, 4), 3);
    TEST_EQ_INT(zr_mul_size_(SIZE_MAX, 2), SIZE_MAX);
    double t0 = zr_now();
    TEST_CHECK(zr_now() >= t0);
    /* the median sorts; an even count gives the mean of the middle two, not the upper one */
    double odd[3] = {5, 1, 3}, even[4] = {9, 1, 4, 2}, one[1] = {7};
    TEST_CHECK(zr_median(odd, 3) == 3 && odd[0] == 1 && odd[2] == 5);
    TEST_CHECK(zr_median(even, 4) == 3 && even[0] == 1 && even[3] == 9);
    TEST_CHECK(zr_median(one, 1) == 7);
}

/* ---- thread pool ------------------------------------------------------------ */

enum { POOL_N = 10007 };

typedef struct pool_probe {
    int hits[POOL_N];   /* times each item was run */
    int thread[POOL_N]; /* the thread that ran it */
    int calls[8];       /* ranges run per thread */
    zr_pool *pool;      /* for the nested call */
    int nested_inline;  /* nested calls that ran whole on the calling thread */
} pool_probe;

static void probe_nested(void *arg, size_t b, size_t e, int t)
{
    int *whole = arg;
    *whole += b == 0 && e == 3 && t == 0;
}

static void probe_task(void *arg, size_t b, size_t e, int t)
{
    pool_probe *p = arg;
    p->calls[t]++;
    for (size_t i = b; i < e; i++) {
        p->hits[i]++;
        p->thread[i] = t;
    }
    int whole = 0;
    zr_pool_run(p->pool, 3, 1, probe_nested, &whole);
    __atomic_fetch_add(&p->nested_inline, whole, __ATOMIC_RELAXED);
}

static void test_pool(void)
{
    static pool_probe p;
    zr_pool *pool;
    TEST_OK(zr_pool_init(&pool, 4));
    TEST_EQ_INT(zr_pool_threads(pool), 4);
    for (int rep = 0; rep < 200; rep++) { /* many jobs in a row: generations, wake-ups */
        memset(&p, 0, sizeof p);
        p.pool = pool;
        size_t n = rep % 2 ? POOL_N : 1000, grain = rep % 3 ? 1 : 400;
        zr_pool_run(pool, n, grain, probe_task, &p);
        int once = 1, ordered = 1, calls = 0;
        for (size_t i = 0; i < n; i++) {
            once &= p.hits[i] == 1;
            ordered &= i == 0 || p.thread[i] >= p.thread[i - 1]; /* contiguous ranges */
        }
        for (int t = 0; t < 8; t++) {
            TEST_CHECK(p.calls[t] <= 1);
            calls += p.calls[t];
        }
        TEST_CHECKF(once && ordered, "job %d: items not run once each in contiguous ranges", rep);
        /* parts = min(threads, n / grain): 1000 / 400 = 2 */
        TEST_EQ_INT(calls, grain == 400 && n == 1000 ? 2 : 4);
        if (rep == 0) {
            TEST_EQ_INT(p.nested_inline, calls);
        }
    }
    memset(&p, 0, sizeof p);
    zr_pool_run(pool, 0, 1, probe_task, &p);
    TEST_EQ_INT(p.calls[0], 0);
    zr_pool_run(pool, 5, 3, probe_task, &p); /* under two grains: inline */
    TEST_EQ_INT(p.calls[0], 1);
    TEST_EQ_INT(p.hits[4], 1);
    zr_pool_free(pool);
    zr_pool_free(NULL);
    TEST_FAILS(zr_pool_init(&pool, 0), ZR_ERR_INVALID, "0 threads");
    TEST_FAILS(zr_pool_init(&pool, ZR_POOL_MAX_THREADS + 1), ZR_ERR_INVALID, "threads");
    /* the process's pool: counted nowhere in zr's memory, resized at will */
    size_t before = zr_mem_current();
    TEST_OK(zr_threads_set(3));
    TEST_EQ_INT(zr_threads_get(), 3);
    TEST_EQ_INT(zr_mem_current(), before);
    memset(&p, 0, sizeof p);
    zr_parallel_for(POOL_N, 1, probe_task, &p);
    TEST_EQ_INT(p.calls[0] + p.calls[1] + p.calls[2], 3);
    TEST_OK(zr_threads_set(1));
    TEST_EQ_INT(zr_threads_get(), 1);
    TEST_FAILS(zr_threads_set(0), ZR_ERR_INVALID, "threads = 0");
}

/* Bytes for a message: printable ASCII and valid UTF-8 kept, the rest escaped, cut with "...";
   an error message quoting file bytes is recorded printable, its own line breaks kept. */
static void test_printable(void)
{
    char out[32];
    TEST_EQ_INT((int)zr_str_printable(out, sizeof out, "ab\x1b[2J\n\xff\xc3\xa9", 10), 17);
    TEST_CHECK(strcmp(out, "ab\\x1b[2J\\n\\xff\xc3\xa9") == 0);
    zr_str_printable(out, sizeof out, "\xc2\x9b\xe2\x80\xae", 5); /* C1 CSI, a bidi override */
    TEST_CHECK(strcmp(out, "\\xc2\\x9b\\xe2\\x80\\xae") == 0);
    char big[100];
    memset(big, 7, sizeof big);
    TEST_EQ_INT((int)zr_str_printable(out, sizeof out, big, sizeof big), 31);
    TEST_CHECK(strcmp(out + 28, "...") == 0 && strncmp(out, "\\x07\\x07", 8) == 0);
    TEST_EQ_INT((int)zr_str_printable(out, 3, "abcdef", 6), 2);
    zr_error_clear();
    (void)zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__, "f: line \"%s\"\n  hint", "\x1b]0;x\x07");
    TEST_CHECK(strcmp(zr_error_message(), "f: line \"\\x1b]0;x\\x07\"\n  hint") == 0);
}

int main(void)
{
    TEST_RUN(test_status_and_messages);
    TEST_RUN(test_printable);
    TEST_RUN(test_alloc);
    TEST_RUN(test_alloc_large_and_sites);
    TEST_RUN(test_crc32c);
    TEST_RUN(test_helpers);
    TEST_RUN(test_pool);
    return zr_test_finish();
}
