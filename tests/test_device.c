/*
 * test_device.c - the device layer (zr/device.h).
 *
 * Everywhere: the CPU device (memory counted like zr_alloc_at's, synchronous
 * copies, streams and events), device specs, the rank-to-GPU mapping as a
 * plain function over CUDA_VISIBLE_DEVICES values and node sizes, and the
 * message a CUDA request gets where it cannot be served ("built without
 * CUDA", or "no GPU found" with the runtime's reason).
 *
 * Where a CUDA device answers (the emulator's, build/emu; a real GPU, the gpu
 * suite): device and pinned memory accounting, copies and memsets on
 * streams, events ordering two streams - and the same program with the event
 * wait left out, which must not pass unnoticed: the emulator reports the
 * race, a GPU reads the data before it was written (the other stream is held
 * back by a gate, so this is certain, not a matter of timing) - and CUDA
 * errors turned into zr_status.
 *
 * Arguments: --no-gpu hides every GPU before the first CUDA call
 * (ZR_EMU_DEVICES=0 for the emulator, CUDA_VISIBLE_DEVICES="" for CUDA) and
 * checks the no-GPU message; --gpu (the gpu suite) skips the whole program
 * where there is no GPU.
 */
#define _POSIX_C_SOURCE 200809L

#include "test.h"
#include "zr/device.h"

#include "../src/base/device_impl.h" /* ZR_CUDA_CHECK, the CUDA stream of a zr_stream */

#include <stdatomic.h>
#include <time.h>

#if ZR_CUDA_EMU
#include <zr_emu.h> /* the emulator's error count: a race it must report */
#endif

static void test_cpu_device(void)
{
    zr_device d = zr_device_cpu();
    TEST_EQ_INT(d.kind, ZR_DEVICE_CPU);
    TEST_CHECK(strcmp(d.name, "cpu") == 0);
    size_t host0 = zr_mem_current(), dev0 = zr_mem_device_current();
    float *a = NULL, *b = NULL;
    TEST_OK(zr_device_alloc_at(&d, (void **)&a, 1000 * sizeof(float), __FILE__, __LINE__));
    TEST_OK(zr_host_alloc_pinned_at(&d, (void **)&b, 1000 * sizeof(float), __FILE__, __LINE__));
    /* the CPU device's memory is host memory, zeroed like zr_alloc_at's */
    TEST_EQ_INT(zr_mem_current() - host0, 2 * zr_round_up(1000 * sizeof(float), ZR_ALIGN));
    TEST_EQ_INT(zr_mem_device_current(), dev0);
    TEST_CHECK(a[0] == 0.0f && a[999] == 0.0f);

    zr_stream *s = NULL;
    zr_event *e0 = NULL, *e1 = NULL;
    TEST_OK(zr_stream_create(&d, &s));
    TEST_OK(zr_event_create(&d, &e0));
    TEST_OK(zr_event_create(&d, &e1));
    TEST_CHECK(zr_stream_device(s)->kind == ZR_DEVICE_CPU);
    for (int i = 0; i < 1000; i++) {
        a[i] = (float)i;
    }
    TEST_OK(zr_event_record(e0, s));
    /* on the CPU device a queued copy is done when the call returns */
    TEST_OK(zr_memcpy_async(b, a, 1000 * sizeof(float), s));
    TEST_CHECK(b[123] == 123.0f);
    TEST_OK(zr_memset_async(a, 0, 10 * sizeof(float), s));
    TEST_CHECK(a[9] == 0.0f && a[10] == 10.0f);
    TEST_OK(zr_event_record(e1, s));
    TEST_OK(zr_stream_wait_event(s, e1));
    TEST_OK(zr_event_sync(e1));
    int done = 0;
    TEST_OK(zr_event_query(e1, &done));
    TEST_CHECK(done);
    float ms = -1.0f;
    TEST_OK(zr_event_elapsed_ms(e0, e1, &ms));
    TEST_CHECK(ms >= 0.0f);
    TEST_OK(zr_stream_sync(s));
    zr_event *never = NULL;
    TEST_OK(zr_event_create(&d, &never));
    TEST_FAILS(zr_event_elapsed_ms(e0, never, &ms), ZR_ERR_INVALID, "never recorded");
    zr_event_destroy(never);
    zr_event_destroy(e0);
    zr_event_destroy(e1);
    zr_stream_destroy(s);
    zr_device_free(&d, a);
    zr_host_free_pinned(&d, b);
    TEST_EQ_INT(zr_mem_current(), host0);
}

static void test_parse(void)
{
    zr_device_kind k;
    int o;
    TEST_OK(zr_device_parse("cpu", &k, &o));
    TEST_CHECK(k == ZR_DEVICE_CPU && o == -1);
    TEST_OK(zr_device_parse("cuda", &k, &o));
    TEST_CHECK(k == ZR_DEVICE_CUDA && o == -1);
    TEST_OK(zr_device_parse("cuda:3", &k, &o));
    TEST_CHECK(k == ZR_DEVICE_CUDA && o == 3);
    TEST_FAILS(zr_device_parse("gpu", &k, &o), ZR_ERR_INVALID, "expected cpu, cuda or cuda:N");
    TEST_FAILS(zr_device_parse("cuda:", &k, &o), ZR_ERR_INVALID, "'cuda:'");
    TEST_FAILS(zr_device_parse("cuda:1x", &k, &o), ZR_ERR_INVALID, "'cuda:1x'");
    TEST_FAILS(zr_device_parse("cuda:-1", &k, &o), ZR_ERR_INVALID, "cuda:-1");
    TEST_FAILS(zr_device_parse(NULL, &k, &o), ZR_ERR_INVALID, "(null)");
}

/* One case of the mapping: every local rank of a node of local_size. */
static void map_case(const char *env, int runtime, int local_size, const int *want_ordinal,
                     const int *want_sharing, const char *const *want_physical)
{
    for (int r = 0; r < local_size; r++) {
        zr_gpu_choice c;
        TEST_OK(zr_device_map_rank(r, local_size, env, runtime, &c));
        TEST_CHECKF(c.ordinal == want_ordinal[r] && c.sharing == want_sharing[r] &&
                        strcmp(c.physical, want_physical[r]) == 0,
                    "CUDA_VISIBLE_DEVICES %s%s%s, %d GPUs, rank %d of %d: ordinal %d sharing %d "
                    "'%s', want %d %d '%s'",
                    env ? "'" : "unset", env ? env : "", env ? "'" : "", runtime, r, local_size,
                    c.ordinal, c.sharing, c.physical, want_ordinal[r], want_sharing[r],
                    want_physical[r]);
    }
}

static void test_rank_mapping(void)
{
    /* one rank per GPU */
    map_case(NULL, 4, 4, (int[]){0, 1, 2, 3}, (int[]){1, 1, 1, 1},
             (const char *[]){"0", "1", "2", "3"});
    /* more ranks than GPUs: round robin, the sharing counts what each GPU carries */
    map_case(NULL, 2, 5, (int[]){0, 1, 0, 1, 0}, (int[]){3, 2, 3, 2, 3},
             (const char *[]){"0", "1", "0", "1", "0"});
    map_case(NULL, 1, 3, (int[]){0, 0, 0}, (int[]){3, 3, 3}, (const char *[]){"0", "0", "0"});
    /* fewer ranks than GPUs: the first ones are used */
    map_case(NULL, 8, 2, (int[]){0, 1}, (int[]){1, 1}, (const char *[]){"0", "1"});
    /* CUDA_VISIBLE_DEVICES reorders and hides: ordinal i is the i-th entry */
    map_case("3,1", 2, 2, (int[]){0, 1}, (int[]){1, 1}, (const char *[]){"3", "1"});
    map_case(" 5 , 7 ", 2, 4, (int[]){0, 1, 0, 1}, (int[]){2, 2, 2, 2},
             (const char *[]){"5", "7", "5", "7"});
    map_case("GPU-8f6e2a1c,MIG-1a2b", 2, 2, (int[]){0, 1}, (int[]){1, 1},
             (const char *[]){"GPU-8f6e2a1c", "MIG-1a2b"});
    /* the list ends at its first invalid entry, as in CUDA */
    map_case("2,x,5", 1, 2, (int[]){0, 0}, (int[]){2, 2}, (const char *[]){"2", "2"});
    map_case("0,,1", 1, 1, (int[]){0}, (int[]){1}, (const char *[]){"0"});
    /* the runtime sees fewer devices than listed (an entry names a missing GPU) */
    map_case("0,1,2,3", 2, 4, (int[]){0, 1, 0, 1}, (int[]){2, 2, 2, 2},
             (const char *[]){"0", "1", "0", "1"});

    zr_gpu_choice c;
    TEST_FAILS(zr_device_map_rank(0, 1, "", 0, &c), ZR_ERR_DEVICE, "no GPU found");
    TEST_FAILS(zr_device_map_rank(0, 1, "-1", 4, &c), ZR_ERR_DEVICE, "CUDA_VISIBLE_DEVICES '-1'");
    TEST_FAILS(zr_device_map_rank(0, 2, NULL, 0, &c), ZR_ERR_DEVICE, "no GPU found");
    TEST_FAILS(zr_device_map_rank(2, 2, NULL, 4, &c), ZR_ERR_INVALID, "local rank 2 of 2");
    TEST_FAILS(zr_device_map_rank(-1, 2, NULL, 4, &c), ZR_ERR_INVALID, "local rank -1");
    TEST_FAILS(zr_device_map_rank(0, 0, NULL, 4, &c), ZR_ERR_INVALID, "of 0 ranks");
}

/* Where no CUDA device answers, every CUDA request fails at once and says why. */
static void test_no_gpu_message(void)
{
    const char *why = zr_device_cuda_built() ? "no GPU found" : "built without CUDA";
    int n = -1;
    TEST_FAILS(zr_device_cuda_count(&n), ZR_ERR_DEVICE, why);
    TEST_EQ_INT(n, 0);
    printf("  the message: %s\n", zr_error_message());
    zr_device d;
    TEST_FAILS(zr_device_open_cuda(0, &d), ZR_ERR_DEVICE, why);
    TEST_FAILS(zr_device_open_for_rank(0, 1, &d), ZR_ERR_DEVICE, why);
#if ZR_CUDA
    if (getenv("ZR_EMU_DEVICES") == NULL) {
        /* the runtime's reason is part of the message (here: no driver, or hidden devices) */
        TEST_CHECK(strstr(zr_error_message(), "cuda") != NULL ||
                   strstr(zr_error_message(), "CUDA") != NULL);
    }
#else
    zr_device fake = zr_device_cpu();
    fake.kind = ZR_DEVICE_CUDA;
    void *p = NULL;
    TEST_FAILS(zr_device_alloc_at(&fake, &p, 16, __FILE__, __LINE__), ZR_ERR_DEVICE,
               "built without CUDA");
    zr_stream *s = NULL;
    TEST_FAILS(zr_stream_create(&fake, &s), ZR_ERR_DEVICE, "built without CUDA");
#endif
}

#if ZR_CUDA

static zr_device gpu;

static void test_cuda_memory(void)
{
    size_t host0 = zr_mem_current(), dev0 = zr_mem_device_current();
    void *a = NULL, *b = NULL, *p = NULL;
    TEST_OK(zr_device_alloc_at(&gpu, &a, 1u << 20, __FILE__, __LINE__));
    TEST_OK(zr_device_alloc_at(&gpu, &b, 100, __FILE__, __LINE__));
    TEST_EQ_INT(zr_mem_device_current() - dev0, (1u << 20) + zr_round_up(100, ZR_ALIGN));
    TEST_CHECK(zr_mem_device_peak() >= zr_mem_device_current());
    TEST_CHECK((uintptr_t)a % ZR_ALIGN == 0 && (uintptr_t)b % ZR_ALIGN == 0);
    size_t host1 = zr_mem_current();
    TEST_OK(zr_host_alloc_pinned_at(&gpu, &p, 5000, __FILE__, __LINE__));
    /* pinned bytes are host bytes */
    TEST_EQ_INT(zr_mem_current() - host1, zr_round_up(5000, ZR_ALIGN));
    TEST_CHECK(((unsigned char *)p)[4999] == 0);
    zr_host_free_pinned(&gpu, p);
    zr_device_free(&gpu, a);
    TEST_EQ_INT(zr_mem_device_current() - dev0, zr_round_up(100, ZR_ALIGN));
    zr_device_free(&gpu, b);
    TEST_EQ_INT(zr_mem_device_current(), dev0);
    TEST_EQ_INT(zr_mem_current(), host0); /* the block table went with the last block */
}

/* A stream function that holds its stream until the test opens the gate. */
static atomic_int gate;

static void CUDART_CB hold_until_open(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 200000};
    while (atomic_load(&gate) == 0) {
        nanosleep(&ts, NULL);
    }
}

/*
 * Two streams over one device buffer of 1s: stream A, held back by the gate,
 * will write 7s into it and record an event; stream B copies it to the host.
 */
typedef struct two_streams {
    zr_stream *a, *b;
    zr_event *ev, *eb;
    unsigned char *dev, *host;
} two_streams;

enum { TWO_N = 4096 };

static int two_open(two_streams *t)
{
    memset(t, 0, sizeof *t);
    int ok = zr_stream_create(&gpu, &t->a) == ZR_OK && zr_stream_create(&gpu, &t->b) == ZR_OK &&
             zr_event_create(&gpu, &t->ev) == ZR_OK && zr_event_create(&gpu, &t->eb) == ZR_OK &&
             zr_device_alloc_at(&gpu, (void **)&t->dev, TWO_N, __FILE__, __LINE__) == ZR_OK &&
             zr_host_alloc_pinned_at(&gpu, (void **)&t->host, TWO_N, __FILE__, __LINE__) == ZR_OK &&
             zr_memset_async(t->dev, 1, TWO_N, t->a) == ZR_OK && zr_stream_sync(t->a) == ZR_OK;
    TEST_CHECKF(ok, "setting up two streams: %s", zr_error_message());
    if (ok) {
        atomic_store(&gate, 0);
        ok = cudaLaunchHostFunc(zr_stream_cuda(t->a), hold_until_open, NULL) == cudaSuccess &&
             zr_memset_async(t->dev, 7, TWO_N, t->a) == ZR_OK &&
             zr_event_record(t->ev, t->a) == ZR_OK;
        TEST_CHECKF(ok, "queueing stream A's work: %s", zr_error_message());
    }
    return ok;
}

static void two_close(two_streams *t)
{
    atomic_store(&gate, 1);
    if (t->a != NULL) {
        TEST_OK(zr_stream_sync(t->a));
    }
    if (t->b != NULL) {
        TEST_OK(zr_stream_sync(t->b));
    }
    zr_event_destroy(t->eb);
    zr_event_destroy(t->ev);
    zr_stream_destroy(t->a);
    zr_stream_destroy(t->b);
    zr_device_free(&gpu, t->dev);
    zr_host_free_pinned(&gpu, t->host);
}

/* With the event wait, B cannot finish while A is held, and sees A's 7s. */
static void test_cuda_streams_events(void)
{
    two_streams t;
    if (two_open(&t)) {
        TEST_OK(zr_stream_wait_event(t.b, t.ev));
        TEST_OK(zr_memcpy_async(t.host, t.dev, TWO_N, t.b));
        TEST_OK(zr_event_record(t.eb, t.b));
        int done = -1;
        TEST_OK(zr_event_query(t.eb, &done));
        TEST_CHECKF(done == 0, "B finished while A was held despite waiting for A's event");
        atomic_store(&gate, 1);
        TEST_OK(zr_event_sync(t.eb));
        int sevens = 1;
        for (int i = 0; i < TWO_N; i++) {
            sevens &= t.host[i] == 7;
        }
        TEST_CHECKF(sevens, "B did not see A's data after waiting for its event");
    }
    two_close(&t);
}

/*
 * The same program without the event wait is a race, and must not pass
 * unnoticed. The emulator reports it when the copy is queued; on a GPU, B
 * runs ahead and copies the 1s (A is held by the gate, so this is certain,
 * not a matter of timing).
 */
static void test_cuda_dropped_wait(void)
{
    two_streams t;
    if (two_open(&t)) {
#if ZR_CUDA_EMU
        TEST_FAILS(zr_memcpy_async(t.host, t.dev, TWO_N, t.b), ZR_ERR_DEVICE, "cudaMemcpyAsync");
        char msg[1024] = "";
        int errors = zr_emu_take_errors(msg, sizeof msg);
        TEST_CHECKF(errors >= 1 && strstr(msg, "race between streams") != NULL,
                    "the emulator did not report the race (%d errors: %s)", errors, msg);
#else
        TEST_OK(zr_memcpy_async(t.host, t.dev, TWO_N, t.b));
        TEST_OK(zr_event_record(t.eb, t.b));
        TEST_OK(zr_event_sync(t.eb)); /* nothing holds B back */
        int ones = 1;
        for (int i = 0; i < TWO_N; i++) {
            ones &= t.host[i] == 1;
        }
        TEST_CHECKF(ones, "B did not run ahead of A without the event wait");
#endif
    }
    two_close(&t);
}

static void test_cuda_copies(void)
{
    enum { N = 10000 };
    zr_stream *s = NULL;
    zr_event *e0 = NULL, *e1 = NULL;
    float *h = NULL, *d1 = NULL, *d2 = NULL, *back = NULL;
    TEST_OK(zr_stream_create(&gpu, &s));
    TEST_OK(zr_event_create(&gpu, &e0));
    TEST_OK(zr_event_create(&gpu, &e1));
    TEST_OK(zr_host_alloc_pinned_at(&gpu, (void **)&h, N * 4, __FILE__, __LINE__));
    TEST_OK(zr_device_alloc_at(&gpu, (void **)&d1, N * 4, __FILE__, __LINE__));
    TEST_OK(zr_device_alloc_at(&gpu, (void **)&d2, N * 4, __FILE__, __LINE__));
    TEST_OK(zr_alloc_at((void **)&back, N * 4, __FILE__, __LINE__)); /* pageable */
    for (int i = 0; i < N; i++) {
        h[i] = (float)i * 0.5f;
    }
    TEST_OK(zr_event_record(e0, s));
    TEST_OK(zr_memcpy_async(d1, h, N * 4, s));    /* host -> device */
    TEST_OK(zr_memcpy_async(d2, d1, N * 4, s));   /* device -> device */
    TEST_OK(zr_memset_async(d2, 0, 16 * 4, s));   /* first 16 floats 0 */
    TEST_OK(zr_memcpy_async(back, d2, N * 4, s)); /* device -> pageable host */
    TEST_OK(zr_event_record(e1, s));
    TEST_OK(zr_event_sync(e1));
    int ok = 1;
    for (int i = 0; i < N; i++) {
        ok &= back[i] == (i < 16 ? 0.0f : (float)i * 0.5f);
    }
    TEST_CHECK(ok);
    float ms = -1.0f;
    TEST_OK(zr_event_elapsed_ms(e0, e1, &ms));
    TEST_CHECK(ms >= 0.0f);
    zr_free(back);
    zr_device_free(&gpu, d1);
    zr_device_free(&gpu, d2);
    zr_host_free_pinned(&gpu, h);
    zr_event_destroy(e0);
    zr_event_destroy(e1);
    zr_stream_destroy(s);
}

static zr_status failing_call(void)
{
    ZR_CUDA_CHECK(cudaSetDevice(-1));
    return ZR_OK;
}

static void test_cuda_errors(void)
{
    /* the call, the place and the runtime's message */
    TEST_FAILS(failing_call(), ZR_ERR_DEVICE, "cudaSetDevice(-1) failed at ");
    TEST_CHECK(strstr(zr_error_message(), "test_device.c:") != NULL);
    TEST_CHECK(strstr(zr_error_message(), cudaGetErrorName(cudaErrorInvalidDevice)) != NULL);
    TEST_CHECK(cudaGetLastError() == cudaSuccess); /* cleared, not left for the next call */
    zr_device d;
    TEST_FAILS(zr_device_open_cuda(999, &d), ZR_ERR_DEVICE, "no GPU cuda:999");
    /* a node with more ranks than GPUs still opens one (with a warning on rank 0) */
    int n = 0;
    TEST_OK(zr_device_cuda_count(&n));
    TEST_OK(zr_device_open_for_rank(n, n + 1, &d));
    TEST_EQ_INT(d.ordinal, 0);
    TEST_OK(zr_device_open_for_rank(0, 1, &d));
    char line[256];
    zr_device_describe(&d, line, sizeof line);
    printf("  %s\n", line);
    TEST_CHECK(strncmp(line, "cuda:0 ", 7) == 0);
}

#endif /* ZR_CUDA */

static int have_gpu;

static void test_hidden_gpus_are_gone(void)
{
    TEST_CHECKF(!have_gpu, "a GPU answers although --no-gpu hid them all");
}

int main(int argc, char **argv)
{
    int gpu_suite = 0, hide = 0;
    for (int i = 1; i < argc; i++) {
        gpu_suite |= strcmp(argv[i], "--gpu") == 0;
        hide |= strcmp(argv[i], "--no-gpu") == 0;
    }
    if (hide) {
        /* before the first CUDA call: the runtimes read these once */
        setenv("ZR_EMU_DEVICES", "0", 1);
        setenv("CUDA_VISIBLE_DEVICES", "", 1);
    }
    int n = 0;
    have_gpu = zr_device_cuda_count(&n) == ZR_OK;
    if (gpu_suite && !have_gpu) {
        return zr_test_skip("%s", zr_error_message());
    }
    zr_error_clear();
    TEST_RUN(test_cpu_device);
    TEST_RUN(test_parse);
    TEST_RUN(test_rank_mapping);
    if (hide) {
        TEST_RUN(test_hidden_gpus_are_gone);
    }
    if (!have_gpu) {
        TEST_RUN(test_no_gpu_message);
    }
#if ZR_CUDA
    if (have_gpu && zr_device_open_cuda(0, &gpu) == ZR_OK) {
        TEST_RUN(test_cuda_memory);
        TEST_RUN(test_cuda_streams_events);
        TEST_RUN(test_cuda_dropped_wait);
        TEST_RUN(test_cuda_copies);
        TEST_RUN(test_cuda_errors);
    }
#endif
    return zr_test_finish();
}
