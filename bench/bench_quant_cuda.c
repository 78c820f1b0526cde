/*
 * bench_quant_cuda.c - "zr bench quant --device cuda": the codec and
 * optimizer kernels on a GPU against a device-to-device copy of the same
 * bytes, measured in the same run.
 *
 *   zr bench quant --device cuda[:N] [--json] [--sizes 256M] [--group G] [--reps N]
 *
 * Each kernel is timed with a pair of CUDA events around one launch, after
 * a warm-up, median of the repetitions (default 20). GB/s counts the bytes
 * of the uncompressed tensor (input of encode, output of decode, each input
 * row of a sum, the fp32 tensor of a cast, the parameters of AdamW), and the
 * copy baseline moves those same bytes with cudaMemcpyAsync, so "x d2d" is
 * how the kernel compares with merely copying the tensor on this GPU.
 * quant_int8_vs_d2d is INT8 encode of fp32 at the largest size (256 MiB of
 * fp32 by default). Without a GPU it exits with status 1 at once, saying why.
 */
#include "../src/cli/cli.h"
#include "zr/device.h"
#include "zr/optim.h"
#include "zr/quant_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 32

typedef struct gbench {
    zr_stream *s;
    zr_event *e0, *e1;
    float *x, *out, *copy, *r, *m, *v;
    zr_bf16 *xh;
    uint8_t *block, *blocks; /* blocks: 4 INT4 blocks back to back, for the sums */
    size_t n, block4;        /* block4: bytes of one INT4 block of n elements */
    zr_quant_params p8, p4;
    double *sq;
} gbench;

enum {
    OP_D2D,
    OP_ENC8_F32,
    OP_ENC8_BF16,
    OP_ENC4_F32,
    OP_ENC4_BF16,
    OP_DEC8_F32,
    OP_DEC8_BF16,
    OP_DEC4_F32,
    OP_SUMREQ4,
    OP_TO_BF16,
    OP_TO_F32,
    OP_SUM_RANKS,
    OP_ADAMW,
    OP_SUMSQ,
    OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
    "d2d copy",
    "encode int8 fp32",
    "encode int8 bf16",
    "encode int4 fp32",
    "encode int4 bf16",
    "decode int8 fp32",
    "decode int8 bf16",
    "decode int4 fp32",
    "sum_requant 4xint4",
    "cast fp32->bf16",
    "cast bf16->fp32",
    "sum_ranks 4xfp32",
    "adamw",
    "sumsq",
};

/* Bytes of the uncompressed side of an op on n elements. */
static size_t op_bytes(int op, size_t n)
{
    switch (op) {
    case OP_ENC8_BF16:
    case OP_ENC4_BF16:
    case OP_DEC8_BF16:
        return 2 * n;
    case OP_SUMREQ4:
    case OP_SUM_RANKS:
        return 4 * (n / 4) * 4; /* four rows of n/4 */
    default:
        return 4 * n;
    }
}

static zr_status run_op(gbench *b, int op)
{
    size_t n = b->n, q = n / 4;
    zr_adamw h = zr_adamw_default();
    const void *ins[4] = {b->blocks, b->blocks + b->block4, b->blocks + 2 * b->block4,
                          b->blocks + 3 * b->block4};
    switch (op) {
    case OP_D2D:
        return zr_memcpy_async(b->copy, b->x, 4 * n, b->s);
    case OP_ENC8_F32:
    case OP_ENC8_BF16:
        return zr_quant_cuda_encode(&b->p8, op == OP_ENC8_BF16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32,
                                    op == OP_ENC8_BF16 ? (const void *)b->xh : b->x, n, 1.0f, NULL,
                                    b->block, b->s);
    case OP_ENC4_F32:
    case OP_ENC4_BF16:
        return zr_quant_cuda_encode(&b->p4, op == OP_ENC4_BF16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32,
                                    op == OP_ENC4_BF16 ? (const void *)b->xh : b->x, n, 1.0f, NULL,
                                    b->block, b->s);
    case OP_DEC8_F32:
    case OP_DEC8_BF16:
    case OP_DEC4_F32:
        return zr_quant_cuda_decode(b->block, op == OP_DEC8_BF16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32,
                                    b->out, n, b->s);
    case OP_SUMREQ4:
        return zr_quant_cuda_sum_requant(ins, 4, q, 0.25f, &b->p4, b->r, b->block, b->s);
    case OP_TO_BF16:
        return zr_bf16_cuda_from_f32(b->xh, b->x, n, b->s);
    case OP_TO_F32:
        return zr_bf16_cuda_to_f32(b->out, b->xh, n, b->s);
    case OP_SUM_RANKS:
        return zr_quant_cuda_sum_ranks(b->out, b->x, ZR_DTYPE_F32, 4, q, q, 4.0f, b->s);
    case OP_ADAMW:
        return zr_adamw_cuda_update(&h, 1e-4f, 1, 1.0f, 1, b->out, b->x, b->m, b->v, n, b->s);
    case OP_SUMSQ:
        return zr_sumsq_cuda(b->x, n, b->sq, b->sq + 1, b->s);
    }
    return ZR_OK;
}

/* Median milliseconds of reps launches of op, after one warm-up. */
static zr_status time_op(gbench *b, int op, int reps, double *ms)
{
    double t[64];
    reps = reps > 64 ? 64 : reps < 1 ? 1 : reps;
    ZR_CHECK(run_op(b, op));
    for (int i = 0; i < reps; i++) {
        ZR_CHECK(zr_event_record(b->e0, b->s));
        ZR_CHECK(run_op(b, op));
        ZR_CHECK(zr_event_record(b->e1, b->s));
        ZR_CHECK(zr_event_sync(b->e1));
        float f = 0;
        ZR_CHECK(zr_event_elapsed_ms(b->e0, b->e1, &f));
        t[i] = f;
    }
    *ms = zr_median(t, reps);
    return ZR_OK;
}

/* Device buffers for n elements, with data: noise in x, valid blocks. */
static zr_status setup(const zr_device *dev, size_t n, int group, gbench *b)
{
    b->n = n;
    b->p8 = (zr_quant_params){8, group, ZR_QUANT_SYM};
    b->p4 = (zr_quant_params){4, group, ZR_QUANT_SYM};
    b->block4 = zr_quant_block_bytes(&b->p4, n / 4);
    ZR_CHECK(zr_quant_params_check(&b->p8));
    ZR_DEVICE_ALLOC(dev, b->x, n);
    ZR_DEVICE_ALLOC(dev, b->out, n);
    ZR_DEVICE_ALLOC(dev, b->copy, n);
    ZR_DEVICE_ALLOC(dev, b->r, n);
    ZR_DEVICE_ALLOC(dev, b->m, n);
    ZR_DEVICE_ALLOC(dev, b->v, n);
    ZR_DEVICE_ALLOC(dev, b->xh, n);
    ZR_DEVICE_ALLOC(dev, b->block, zr_quant_block_bytes(&b->p8, n));
    ZR_DEVICE_ALLOC(dev, b->blocks, 4 * b->block4);
    ZR_DEVICE_ALLOC(dev, b->sq, 1 + ZR_SUMSQ_CUDA_WORK);
    float *host;
    ZR_CHECK(zr_host_alloc_pinned_at(dev, (void **)&host, n * 4, __FILE__, __LINE__));
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = (float)((int32_t)(s >> 32)) * (1.0f / 2147483648.0f);
    }
    zr_status st = zr_memcpy_async(b->x, host, n * 4, b->s);
    if (st == ZR_OK) {
        st = zr_stream_sync(b->s);
    }
    zr_host_free_pinned(dev, host);
    ZR_CHECK(st);
    ZR_CHECK(zr_memset_async(b->r, 0, n * 4, b->s));
    ZR_CHECK(zr_memset_async(b->m, 0, n * 4, b->s));
    ZR_CHECK(zr_memset_async(b->v, 0, n * 4, b->s));
    ZR_CHECK(zr_bf16_cuda_from_f32(b->xh, b->x, n, b->s));
    for (int j = 0; j < 4; j++) {
        ZR_CHECK(zr_quant_cuda_encode(&b->p4, ZR_DTYPE_F32, b->x + (size_t)j * (n / 4), n / 4, 1.0f,
                                      NULL, b->blocks + (size_t)j * b->block4, b->s));
    }
    return zr_stream_sync(b->s);
}

static void teardown(const zr_device *dev, gbench *b)
{
    zr_device_free(dev, b->x);
    zr_device_free(dev, b->out);
    zr_device_free(dev, b->copy);
    zr_device_free(dev, b->r);
    zr_device_free(dev, b->m);
    zr_device_free(dev, b->v);
    zr_device_free(dev, b->xh);
    zr_device_free(dev, b->block);
    zr_device_free(dev, b->blocks);
    zr_device_free(dev, b->sq);
    b->x = b->out = b->copy = b->r = b->m = b->v = NULL;
    b->xh = NULL;
    b->block = b->blocks = NULL;
    b->sq = NULL;
}

/* "64M", "96K" or "1000": a count of elements for the table. */
static const char *count_str(size_t n, char *buf, size_t size)
{
    if (n >= ((size_t)1 << 20) && n % ((size_t)1 << 20) == 0) {
        snprintf(buf, size, "%zuM", n >> 20);
    } else if (n >= 1024 && n % 1024 == 0) {
        snprintf(buf, size, "%zuK", n >> 10);
    } else {
        snprintf(buf, size, "%zu", n);
    }
    return buf;
}

typedef struct grow {
    int op;
    size_t n;
    double gbps, d2d_gbps;
} grow;

/* The rows of one size; the d2d baseline of each row moves the row's bytes. */
static zr_status bench_size(gbench *b, int reps, grow *rows, int *nrows, double *headline)
{
    for (int op = OP_ENC8_F32; op < OP_COUNT; op++) {
        if (op == OP_DEC8_F32 || op == OP_DEC8_BF16) {
            ZR_CHECK(run_op(b, OP_ENC8_F32)); /* decode an INT8 block */
        } else if (op == OP_DEC4_F32) {
            ZR_CHECK(run_op(b, OP_ENC4_F32));
        }
        double ms, ms_copy;
        ZR_CHECK(time_op(b, op, reps, &ms));
        size_t bytes = op_bytes(op, b->n);
        /* the copy of the same bytes, timed right after, on the same buffers */
        size_t keep = b->n;
        b->n = bytes / 4;
        zr_status st = time_op(b, OP_D2D, reps, &ms_copy);
        b->n = keep;
        ZR_CHECK(st);
        grow *r = &rows[(*nrows)++];
        r->op = op;
        r->n = b->n;
        r->gbps = (double)bytes / (ms * 1e-3) / 1e9;
        r->d2d_gbps = (double)bytes / (ms_copy * 1e-3) / 1e9;
        char cs[32];
        printf("%-20s %10s %10.1f %10.1f %8.2f\n", op_names[op], count_str(b->n, cs, sizeof cs),
               r->gbps, r->d2d_gbps, r->gbps / r->d2d_gbps);
        if (op == OP_ENC8_F32) {
            *headline = r->gbps / r->d2d_gbps;
        }
    }
    return ZR_OK;
}

static void print_json(const zr_device *dev, int group, const grow *rows, int nrows,
                       double headline)
{
    char desc[256];
    zr_device_describe(dev, desc, sizeof desc);
    printf("{\"bench\":\"quant\",\"device\":\"%s\",\"group\":%d,\"results\":[", desc, group);
    for (int i = 0; i < nrows; i++) {
        printf("%s{\"op\":\"%s\",\"n\":%zu,\"gbps\":%.2f,\"d2d_gbps\":%.2f,\"ratio\":%.3f}",
               i ? "," : "", op_names[rows[i].op], rows[i].n, rows[i].gbps, rows[i].d2d_gbps,
               rows[i].gbps / rows[i].d2d_gbps);
    }
    printf("],\"quant_int8_vs_d2d\":%.3f}\n", headline);
}

int zr_bench_quant_cuda(const char *spec, int json, const size_t *sizes, int nsizes, int group,
                        int reps)
{
    zr_device_kind kind;
    int ordinal;
    zr_device dev;
    zr_status st = zr_device_parse(spec, &kind, &ordinal);
    if (st == ZR_OK) {
        st = zr_device_open_cuda(ordinal < 0 ? 0 : ordinal, &dev);
    }
    if (st != ZR_OK) {
        fprintf(stderr, "zr bench quant: --device %s: %s\n", spec, zr_error_message());
        return 1;
    }
    char desc[256];
    zr_device_describe(&dev, desc, sizeof desc);
    printf("zr bench quant: %s, group %d, median of %d launches timed with CUDA events,\n"
           "GB/s of the uncompressed tensor; d2d = cudaMemcpyAsync of the same bytes\n\n",
           desc, group, reps);
    printf("%-20s %10s %10s %10s %8s\n", "op", "elements", "GB/s", "d2d GB/s", "x d2d");
    grow rows[MAX_ROWS * 4];
    int nrows = 0;
    double headline = 0;
    gbench b;
    memset(&b, 0, sizeof b);
    st = zr_stream_create(&dev, &b.s);
    if (st == ZR_OK) {
        st = zr_event_create(&dev, &b.e0);
    }
    if (st == ZR_OK) {
        st = zr_event_create(&dev, &b.e1);
    }
    for (int i = 0; i < nsizes && st == ZR_OK; i++) {
        st = setup(&dev, sizes[i], group, &b);
        if (st == ZR_OK) {
            st = bench_size(&b, reps, rows, &nrows, &headline);
        }
        teardown(&dev, &b);
    }
    zr_event_destroy(b.e0);
    zr_event_destroy(b.e1);
    zr_stream_destroy(b.s);
    if (st != ZR_OK) {
        fprintf(stderr, "zr bench quant: %s: %s\n", zr_status_str(st), zr_error_message());
        return 1;
    }
    char cs[32];
    printf("\nquant_int8_vs_d2d (INT8 encode of fp32, %s elements = %.0f MiB): %.2f\n",
           count_str(sizes[nsizes - 1], cs, sizeof cs), (double)sizes[nsizes - 1] * 4 / (1 << 20),
           headline);
    if (json) {
        print_json(&dev, group, rows, nrows, headline);
    }
    return 0;
}
