/*
 * bench_attention.c - "zr bench attention": the causal attention kernels of
 * the CUDA model (issue 42), one at a time, every variant side by side.
 *
 *   zr bench attention [--device cuda[:N]] [--json] [--quick]
 *
 * Shapes: GPT-2's B 32 x T 1024 x NH 12 at head sizes 64 and 128 (C = 12
 * hs), bf16 inputs uniform in [-1, 1). Variants: the scalar kernels
 * (attention_cuda.cu), then each tensor-core variant of attention_flash.cu
 * (ZR_OP_CUDA_ATT_VARIANTS: 0 the default, 1 double-buffered tiles, 2 the
 * forward's rescale skipped where no row's maximum moved). Each
 * kernel is timed alone with CUDA events, the median of the timed runs after
 * one warm-up: forward, the whole backward, and for the tensor-core variants
 * its parts (dO . O rows, dK/dV, dQ). TFLOP/s counts the causal products
 * only (T^2 / 2 scores a head): forward 2 products, backward 5, dK/dV 4, dQ
 * 3, 2 B NH (T^2 / 2) hs FLOPs each. Each variant's out and dqkv are
 * compared with variant 0's (largest |difference|, which should be at bf16
 * rounding): a variant that is fast and wrong shows here. --quick: B 1 x T
 * 100 x NH 2, one timed run (a smoke test, e.g. on the emulator). Without a
 * GPU it exits with status 1, saying so.
 */
#include "../src/cli/cli.h"
#include "../src/model/ops_table.h" /* the kernels by variant: internal to src/model */
#include "zr/gpt_engine.h"
#include "zr/quant.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_FWD, K_BWD, K_DELTA, K_DKV, K_DQ, NK };
static const char *const k_name[NK] = {"fwd", "bwd", "delta", "bwd_dkv", "bwd_dq"};
static const double k_prod[NK] = {2, 5, 0, 4, 3}; /* causal products of each */

typedef struct att_bench {
    const zr_op_table *ops; /* the CUDA backend's */
    zr_device dev;
    zr_stream *s;
    zr_event *e0, *e1;
    int B, T, NH, C, reps;
    void *qkv, *out, *dout, *dqkv, *out0, *dqkv0;
    float *lse, *delta;
    char json[8192]; /* the JSON runs so far, printed at the end */
    size_t jn;
} att_bench;

/* Append to a->json (truncated when full, which 2 shapes x 3 variants never fill). */
static void jadd(att_bench *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(a->json + a->jn, sizeof a->json - a->jn, fmt, ap);
    va_end(ap);
    if (n > 0) {
        a->jn = a->jn + (size_t)n < sizeof a->json ? a->jn + (size_t)n : sizeof a->json - 1;
    }
}

static zr_status run_kernel(att_bench *a, int v, int k)
{
    const zr_dtype t = ZR_DTYPE_BF16;
    if (k == K_FWD) {
        return a->ops->attention_fwd_variant(v, t, a->out, a->lse, a->qkv, a->B, a->T, a->C, a->NH,
                                             a->s);
    }
    int part = k == K_BWD ? 0 : k - K_BWD;
    return a->ops->attention_bwd_variant(v, part, t, a->dqkv, a->delta, a->dout, a->qkv, a->out0,
                                         a->lse, a->B, a->T, a->C, a->NH, a->s);
}

/* Median ms of kernel k of variant v over a->reps runs after one warm-up. */
static zr_status time_kernel(att_bench *a, int v, int k, double *ms)
{
    double t[16];
    ZR_CHECK(run_kernel(a, v, k));
    for (int r = 0; r < a->reps; r++) {
        float f;
        ZR_CHECK(zr_event_record(a->e0, a->s));
        ZR_CHECK(run_kernel(a, v, k));
        ZR_CHECK(zr_event_record(a->e1, a->s));
        ZR_CHECK(zr_event_sync(a->e1));
        ZR_CHECK(zr_event_elapsed_ms(a->e0, a->e1, &f));
        t[r] = f;
    }
    *ms = zr_median(t, a->reps);
    return ZR_OK;
}

/* Largest |x - y| of two device bf16 arrays of n elements. */
static zr_status max_diff(att_bench *a, const void *x, const void *y, size_t n, double *d)
{
    zr_status st = ZR_OK;
    zr_bf16 *h = NULL;
    float *fx = NULL, *fy = NULL;
    ZR_CHECK_GOTO(zr_alloc_at((void **)&h, n * 2, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_alloc_at((void **)&fx, n * 4, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_alloc_at((void **)&fy, n * 4, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_memcpy_async(h, x, n * 2, a->s), st, done);
    ZR_CHECK_GOTO(zr_stream_sync(a->s), st, done);
    zr_bf16_to_f32_n(fx, h, n);
    ZR_CHECK_GOTO(zr_memcpy_async(h, y, n * 2, a->s), st, done);
    ZR_CHECK_GOTO(zr_stream_sync(a->s), st, done);
    zr_bf16_to_f32_n(fy, h, n);
    *d = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)fx[i] - (double)fy[i]);
        *d = e > *d || e != e ? e : *d;
    }
done:
    zr_free(h);
    zr_free(fx);
    zr_free(fy);
    return st;
}

static zr_status dalloc(att_bench *a, void **p, size_t bytes)
{
    return zr_device_alloc_at(&a->dev, p, bytes, __FILE__, __LINE__);
}

/* Device buffers for the shape, qkv and dout uniform in [-1, 1) as bf16. */
static zr_status shape_init(att_bench *a)
{
    const size_t bt = (size_t)a->B * a->T, n3 = bt * 3 * a->C, rows = bt * a->NH;
    zr_status st = ZR_OK;
    float *x = NULL;
    zr_bf16 *h = NULL;
    ZR_CHECK(dalloc(a, &a->qkv, n3 * 2));
    ZR_CHECK(dalloc(a, &a->dqkv, n3 * 2));
    ZR_CHECK(dalloc(a, &a->dqkv0, n3 * 2));
    ZR_CHECK(dalloc(a, &a->out, bt * a->C * 2));
    ZR_CHECK(dalloc(a, &a->out0, bt * a->C * 2));
    ZR_CHECK(dalloc(a, &a->dout, bt * a->C * 2));
    ZR_CHECK(dalloc(a, (void **)&a->lse, rows * 4));
    ZR_CHECK(dalloc(a, (void **)&a->delta, rows * 4));
    ZR_CHECK_GOTO(zr_alloc_at((void **)&x, n3 * 4, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_alloc_at((void **)&h, n3 * 2, __FILE__, __LINE__), st, done);
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n3; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        x[i] = (float)((r >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    }
    zr_bf16_from_f32_n(h, x, n3);
    ZR_CHECK_GOTO(zr_memcpy_async(a->qkv, h, n3 * 2, a->s), st, done);
    ZR_CHECK_GOTO(zr_memcpy_async(a->dout, h + bt * a->C, bt * a->C * 2, a->s), st, done);
    ZR_CHECK_GOTO(zr_stream_sync(a->s), st, done);
done:
    zr_free(x);
    zr_free(h);
    return st;
}

static void shape_free(att_bench *a)
{
    void *p[] = {a->qkv, a->out, a->dout, a->dqkv, a->out0, a->dqkv0, a->lse, a->delta};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        zr_device_free(&a->dev, p[i]);
    }
}

/* One variant's kernels at this shape: a table line and a JSON entry. */
static zr_status bench_variant(att_bench *a, int v, int hs)
{
    const double causal = 2.0 * a->B * a->NH * ((double)a->T * a->T / 2) * hs;
    const size_t n3 = (size_t)a->B * a->T * 3 * a->C, no = (size_t)a->B * a->T * a->C;
    double ms[NK] = {0}, dout = 0, dgrad = 0;
    ZR_CHECK(a->ops->attention_fwd_variant(0, ZR_DTYPE_BF16, a->out0, a->lse, a->qkv, a->B, a->T,
                                           a->C, a->NH, a->s));
    for (int k = 0; k < NK; k++) {
        if (v >= 0 || k <= K_BWD) {
            ZR_CHECK(time_kernel(a, v, k, &ms[k]));
        }
    }
    ZR_CHECK(run_kernel(a, v, K_FWD));
    ZR_CHECK(run_kernel(a, v, K_BWD));
    if (v == 0) {
        ZR_CHECK(zr_memcpy_async(a->dqkv0, a->dqkv, n3 * 2, a->s));
    }
    ZR_CHECK(max_diff(a, a->out, a->out0, no, &dout));
    ZR_CHECK(max_diff(a, a->dqkv, a->dqkv0, n3, &dgrad));
    static const char *const names[ZR_OP_CUDA_ATT_VARIANTS] = {"flash_v0", "flash_v1_db",
                                                               "flash_v2_skip"};
    const char *name = v < 0 ? "scalar" : names[v];
    printf("  hs %3d %-13s", hs, name);
    for (int k = 0; k < NK; k++) {
        if (ms[k] > 0) {
            printf("  %s %.3f ms %.1f TF/s", k_name[k], ms[k], k_prod[k] * causal / ms[k] * 1e-9);
        }
    }
    printf("  |out - v0| %.2g  |dqkv - v0| %.2g\n", dout, dgrad);
    jadd(a, "%s{\"hs\":%d,\"variant\":\"%s\",\"diff_out\":%.3g,\"diff_dqkv\":%.3g",
         a->jn == 0 ? "" : ",", hs, name, dout, dgrad);
    for (int k = 0; k < NK; k++) {
        jadd(a, ",\"%s_ms\":%.4f", k_name[k], ms[k]);
    }
    jadd(a, "}");
    return ZR_OK;
}

/* Variant 0 first (the others' reference), the scalar kernels last, at hs 64 and 128. */
static zr_status bench_shapes(att_bench *a)
{
    static const int hss[] = {64, 128};
    zr_status st = ZR_OK;
    for (int i = 0; i < 2 && st == ZR_OK; i++) {
        a->C = a->NH * hss[i];
        st = shape_init(a);
        for (int v = 0; v <= ZR_OP_CUDA_ATT_VARIANTS && st == ZR_OK; v++) {
            st = bench_variant(a, v == ZR_OP_CUDA_ATT_VARIANTS ? -1 : v, hss[i]);
        }
        (void)zr_stream_sync(a->s);
        shape_free(a);
    }
    return st;
}

int zr_bench_attention(int argc, char **argv)
{
    const char *spec = "cuda";
    int json = 0, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            spec = argv[++i];
        } else {
            fprintf(stderr, "usage: zr bench attention [--device cuda[:N]] [--json] [--quick]\n");
            return 2;
        }
    }
    att_bench a;
    memset(&a, 0, sizeof a);
    zr_device_kind kind;
    int ordinal;
    zr_status st = zr_device_parse(spec, &kind, &ordinal);
    const zr_gpt_backend_i *be = NULL;
    if (st == ZR_OK) {
        st = zr_gpt_backend_of(ZR_DEVICE_CUDA, &be);
    }
    if (st == ZR_OK) {
        a.ops = be->ops;
        st = zr_device_open_cuda(ordinal < 0 ? 0 : ordinal, &a.dev);
    }
    if (st != ZR_OK) {
        fprintf(stderr, "zr bench attention: --device %s: %s\n", spec, zr_error_message());
        return 1;
    }
    a.B = quick ? 1 : 32, a.T = quick ? 100 : 1024, a.NH = quick ? 2 : 12, a.reps = quick ? 1 : 7;
    char desc[256];
    zr_device_describe(&a.dev, desc, sizeof desc);
    printf("zr bench attention: %s, causal, bf16, B %d x T %d x NH %d, median of %d runs%s\n", desc,
           a.B, a.T, a.NH, a.reps, quick ? "; --quick: a smoke test, not a measurement" : "");
    st = zr_stream_create(&a.dev, &a.s);
    if (st == ZR_OK) {
        st = zr_event_create(&a.dev, &a.e0);
    }
    if (st == ZR_OK) {
        st = zr_event_create(&a.dev, &a.e1);
    }
    if (st == ZR_OK) {
        st = bench_shapes(&a);
    }
    zr_event_destroy(a.e0);
    zr_event_destroy(a.e1);
    zr_stream_destroy(a.s);
    if (st != ZR_OK) {
        fprintf(stderr, "zr bench attention: %s: %s\n", zr_status_str(st), zr_error_message());
        return 1;
    }
    if (json) {
        printf("{\"bench\":\"attention\",\"device\":\"%s\",\"B\":%d,\"T\":%d,\"NH\":%d,"
               "\"runs\":[%s]}\n",
               desc, a.B, a.T, a.NH, a.json);
    }
    return 0;
}
