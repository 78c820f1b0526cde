/*
 * probe_gpu.c - `zr probe` on GPUs (probe_impl.h): the compute and
 * per-element figures of probe.c measured on each rank's GPU, in the way a
 * GPU run spends them.
 *
 *   compute     the device model (zr/model_cuda.h) of one block, in the
 *               run's compute type (bf16.enabled), each unit timed by events
 *               around its kernels on the stream, as the engine drives them
 *   per element the engine's kernels on device buffers: AdamW, the sum of
 *               squares, bf16 casts, the fp32 fold, INT8/INT4 encode and
 *               decode-add (zr/optim.h, zr/quant_cuda.h), by events
 *   busy        GPU work for the overlap measurement: kernels queued while the
 *               host drives a transfer, as the engine's stream does while the
 *               host waits for a collective
 *
 * Every figure is a mean over a window of repetitions after one unmeasured
 * (cuBLAS picks its algorithms, caches warm); probe.c takes the slowest
 * rank's. The emulator (tests/emu) runs kernels on CPU threads, so there the
 * per-element buffers are small: its figures only exercise the code.
 */
#include "probe_impl.h"

#include "zr/model_cuda.h"

#include "zr/optim.h"
#include "zr/quant_cuda.h"

#include <string.h>

#if ZR_CUDA_EMU
enum { NEL = 1 << 14 };
#else
enum { NEL = 1 << 24 }; /* 64 MiB of fp32: past any L2, many waves of blocks */
#endif
enum { REPS = 5 };
#define WINDOW_S 0.3

/* ---- compute ---------------------------------------------------------------------- */

typedef struct gbufs {
    void *p[3], *g[3]; /* compute type */
    int *tok;          /* host */
} gbufs;

/* Seconds between consecutive events of ev[0..n]. */
static zr_status elapsed(zr_event **ev, int n, double *d)
{
    for (int k = 0; k < n; k++) {
        float ms = 0;
        ZR_CHECK(zr_event_elapsed_ms(ev[k], ev[k + 1], &ms));
        d[k] = ms * 1e-3;
    }
    return ZR_OK;
}

static zr_status time_gpu_units(zr_gpt_cuda *m, gbufs *b, zr_stream *s, zr_event **ev,
                                zr_probe_compute *out)
{
    double sum[6] = {0, 0, 0, 0, 0, 0}, start = 0;
    int n = 0;
    for (int r = 0; r < REPS + 1 || zr_now() - start < WINDOW_S; r++) {
        ZR_CHECK(zr_gpt_cuda_forward_begin(m, b->tok, b->tok + 1));
        ZR_CHECK(zr_event_record(ev[0], s));
        ZR_CHECK(zr_gpt_cuda_forward_unit(m, 0, b->p[0], NULL));
        ZR_CHECK(zr_event_record(ev[1], s));
        ZR_CHECK(zr_gpt_cuda_forward_unit(m, 1, b->p[1], NULL));
        ZR_CHECK(zr_event_record(ev[2], s));
        ZR_CHECK(zr_gpt_cuda_forward_unit(m, 2, b->p[2], b->p[0]));
        ZR_CHECK(zr_event_record(ev[3], s));
        ZR_CHECK(zr_gpt_cuda_backward_begin(m));
        ZR_CHECK(zr_gpt_cuda_backward_unit(m, 2, b->p[2], b->p[0], b->g[2], b->g[0]));
        ZR_CHECK(zr_event_record(ev[4], s));
        ZR_CHECK(zr_gpt_cuda_backward_unit(m, 1, b->p[1], NULL, b->g[1], NULL));
        ZR_CHECK(zr_event_record(ev[5], s));
        ZR_CHECK(zr_gpt_cuda_backward_unit(m, 0, NULL, NULL, b->g[0], NULL));
        ZR_CHECK(zr_event_record(ev[6], s));
        ZR_CHECK(zr_event_sync(ev[6]));
        if (r == 0) {
            start = zr_now();
            continue;
        }
        double d[6];
        ZR_CHECK(elapsed(ev, 6, d));
        for (int k = 0; k < 6; k++) {
            sum[k] += d[k];
        }
        n++;
    }
    out->fwd_embed = sum[0] / n;
    out->fwd_block = sum[1] / n;
    out->fwd_head = sum[2] / n;
    out->bwd_head = sum[3] / n;
    out->bwd_block = sum[4] / n;
    out->bwd_embed = sum[5] / n;
    return ZR_OK;
}

/* Unit u's initial parameters, in the compute type, into the device buffer dst. */
static zr_status upload_params(const zr_gpt_config *g, int u, zr_dtype type, void *dst,
                               zr_stream *s)
{
    size_t n = zr_gpt_config_unit_numel(g, u);
    zr_gpt host;
    memset(&host, 0, sizeof host);
    float *f = NULL;
    zr_bf16 *h = NULL;
    zr_status st;
    ZR_CHECK_GOTO(zr_gpt_init_ex(&host, g, 1, 1, 0), st, done);
    ZR_ALLOC_GOTO(f, n, st, done);
    zr_gpt_unit_init_params(&host, u, f, 1);
    if (type == ZR_DTYPE_BF16) {
        ZR_ALLOC_GOTO(h, n, st, done);
        zr_bf16_from_f32_n(h, f, n);
    }
    ZR_CHECK_GOTO(
        zr_memcpy_async(dst, h != NULL ? (void *)h : (void *)f, n * zr_dtype_size(type), s), st,
        done);
    st = zr_stream_sync(s);
done:
    zr_free(f);
    zr_free(h);
    zr_gpt_free(&host);
    return st;
}

static zr_status gpu_compute_local(const zr_gpt_config *g, int T, int b, zr_dtype type,
                                   zr_stream *s, zr_probe_compute *out)
{
    const zr_device *dev = zr_stream_device(s);
    zr_gpt_cuda m;
    memset(&m, 0, sizeof m);
    gbufs bf;
    memset(&bf, 0, sizeof bf);
    zr_event *ev[7] = {NULL};
    zr_status st;
    ZR_CHECK_GOTO(zr_gpt_cuda_init(&m, g, b, T, type, s), st, done);
    for (int u = 0; u < 3; u++) {
        size_t bytes = zr_gpt_config_unit_numel(g, u) * zr_dtype_size(type);
        ZR_CHECK_GOTO(zr_device_alloc_at(dev, &bf.p[u], bytes, __FILE__, __LINE__), st, done);
        ZR_CHECK_GOTO(zr_device_alloc_at(dev, &bf.g[u], bytes, __FILE__, __LINE__), st, done);
        ZR_CHECK_GOTO(upload_params(g, u, type, bf.p[u], s), st, done);
        ZR_CHECK_GOTO(zr_memset_async(bf.g[u], 0, bytes, s), st, done);
    }
    ZR_ALLOC_GOTO(bf.tok, (size_t)b * (size_t)T + 1, st, done);
    for (size_t i = 0; i < (size_t)b * (size_t)T + 1; i++) {
        bf.tok[i] = (int)((i * 2654435761u) % (size_t)g->vocab);
    }
    for (int k = 0; k < 7; k++) {
        ZR_CHECK_GOTO(zr_event_create(dev, &ev[k]), st, done);
    }
    st = time_gpu_units(&m, &bf, s, ev, out);
done:
    (void)zr_stream_sync(s);
    for (int k = 0; k < 7; k++) {
        zr_event_destroy(ev[k]);
    }
    for (int u = 0; u < 3; u++) {
        zr_device_free(dev, bf.p[u]);
        zr_device_free(dev, bf.g[u]);
    }
    zr_free(bf.tok);
    zr_gpt_cuda_free(&m);
    return st;
}

zr_status zr_probe_gpu_compute(zr_comm *c, const zr_gpt_config *g, int T, int b, zr_dtype type,
                               zr_stream *s, zr_probe_compute *out)
{
    memset(out, 0, sizeof *out);
    ZR_CHECK(zr_comm_barrier(c));
    ZR_CHECK(zr_comm_agree(c, gpu_compute_local(g, T, b, type, s, out)));
    out->batch = b;
    return ZR_OK;
}

/* ---- per-element costs -------------------------------------------------------------- */

typedef struct dkern {
    float *x, *y, *m, *v;
    zr_bf16 *h;
    unsigned char *blk;
    double *sq, *work;
} dkern;

/* Kernel `which` (probe.c's order) once on k's buffers, queued on s. */
static zr_status run_kernel(dkern *k, int which, zr_stream *s)
{
    zr_adamw h = zr_adamw_default();
    zr_quant_params q8 = {8, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM},
                    q4 = {4, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM};
    switch (which) {
    case 0:
        return zr_adamw_cuda_update(&h, 1e-4f, 1, 1.0f, 1, k->x, k->y, k->m, k->v, NEL, s);
    case 1:
        return zr_sumsq_cuda(k->x, NEL, k->sq, k->work, s);
    case 2:
        return zr_bf16_cuda_from_f32(k->h, k->x, NEL, s);
    case 3:
        return zr_bf16_cuda_to_f32(k->y, k->h, NEL, s);
    case 4:
        return zr_quant_cuda_add(k->m, k->y, ZR_DTYPE_F32, NEL, s);
    case 5:
    case 7:
        return zr_quant_cuda_encode(which == 5 ? &q8 : &q4, ZR_DTYPE_F32, k->x, NEL, 1.0f, NULL,
                                    k->blk, s);
    default:
        return zr_quant_cuda_decode_add(k->blk, k->m, NEL, s);
    }
}

/* Mean seconds per element of kernel which. */
static zr_status time_kernel(dkern *k, int which, zr_stream *s, zr_event **ev, double *out)
{
    double sum = 0, start = 0;
    int n = 0;
    for (int r = 0; r < REPS + 1 || zr_now() - start < WINDOW_S / 4; r++) {
        ZR_CHECK(zr_event_record(ev[0], s));
        ZR_CHECK(run_kernel(k, which, s));
        ZR_CHECK(zr_event_record(ev[1], s));
        ZR_CHECK(zr_event_sync(ev[1]));
        if (r == 0) {
            start = zr_now();
            continue;
        }
        double d;
        ZR_CHECK(elapsed(ev, 1, &d));
        sum += d / NEL;
        n++;
    }
    *out = sum / n;
    return ZR_OK;
}

static zr_status gpu_kernels_local(zr_stream *s, double *v)
{
    const zr_device *dev = zr_stream_device(s);
    dkern k;
    memset(&k, 0, sizeof k);
    zr_event *ev[2] = {NULL, NULL};
    zr_quant_params q8 = {8, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM};
    size_t qb = zr_quant_block_bytes(&q8, NEL) + 64;
    float **f[4] = {&k.x, &k.y, &k.m, &k.v};
    zr_status st = ZR_OK;
    float *host = NULL;
    for (int i = 0; i < 4 && st == ZR_OK; i++) {
        st = zr_device_alloc_at(dev, (void **)f[i], NEL * sizeof(float), __FILE__, __LINE__);
    }
    ZR_CHECK_GOTO(st, st, done);
    ZR_CHECK_GOTO(zr_device_alloc_at(dev, (void **)&k.h, NEL * sizeof(zr_bf16), __FILE__, __LINE__),
                  st, done);
    ZR_CHECK_GOTO(zr_device_alloc_at(dev, (void **)&k.blk, qb, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_device_alloc_at(dev, (void **)&k.sq, sizeof(double), __FILE__, __LINE__), st,
                  done);
    ZR_CHECK_GOTO(zr_device_alloc_at(dev, (void **)&k.work, ZR_SUMSQ_CUDA_WORK * sizeof(double),
                                     __FILE__, __LINE__),
                  st, done);
    /* values of a trained model's size, never zeros (a zero group codes differently) */
    ZR_ALLOC_GOTO(host, NEL, st, done);
    for (size_t i = 0; i < NEL; i++) {
        host[i] = (float)((int)(i % 2001) - 1000) * 1e-3f;
    }
    for (int i = 0; i < 4; i++) {
        ZR_CHECK_GOTO(zr_memcpy_async(*f[i], host, NEL * sizeof(float), s), st, done);
    }
    ZR_CHECK_GOTO(zr_event_create(dev, &ev[0]), st, done);
    ZR_CHECK_GOTO(zr_event_create(dev, &ev[1]), st, done);
    /* the INT8 block decode-add reads must hold a valid block: encode once first */
    ZR_CHECK_GOTO(run_kernel(&k, 5, s), st, done);
    for (int w = 0; w < 9; w++) {
        /* decode-adds read the block the encode before them wrote (5 -> 6, 7 -> 8) */
        ZR_CHECK_GOTO(time_kernel(&k, w, s, ev, &v[w]), st, done);
    }
done:
    (void)zr_stream_sync(s);
    zr_event_destroy(ev[0]);
    zr_event_destroy(ev[1]);
    zr_free(host);
    for (int i = 0; i < 4; i++) {
        zr_device_free(dev, *f[i]);
    }
    zr_device_free(dev, k.h);
    zr_device_free(dev, k.blk);
    zr_device_free(dev, k.sq);
    zr_device_free(dev, k.work);
    return st;
}

zr_status zr_probe_gpu_kernels(zr_comm *c, zr_stream *s, double v[9])
{
    memset(v, 0, 9 * sizeof *v);
    ZR_CHECK(zr_comm_barrier(c));
    return zr_comm_agree(c, gpu_kernels_local(s, v));
}

/* ---- busy work for the overlap measurement --------------------------------------------- */

zr_status zr_probe_gpu_busy_init(zr_stream *s, zr_probe_busy *b)
{
    memset(b, 0, sizeof *b);
    const zr_device *dev = zr_stream_device(s);
    b->s = s;
    b->n = NEL;
    ZR_CHECK(zr_device_alloc_at(dev, (void **)&b->x, NEL * sizeof(float), __FILE__, __LINE__));
    ZR_CHECK(zr_device_alloc_at(dev, (void **)&b->sq, sizeof(double), __FILE__, __LINE__));
    ZR_CHECK(zr_device_alloc_at(dev, (void **)&b->work, ZR_SUMSQ_CUDA_WORK * sizeof(double),
                                __FILE__, __LINE__));
    ZR_CHECK(zr_memset_async(b->x, 0, NEL * sizeof(float), s));
    /* one kernel's time, to queue as many as a wanted busy time takes */
    double t0 = zr_now();
    for (int r = 0; r < 3; r++) {
        ZR_CHECK(zr_sumsq_cuda(b->x, b->n, b->sq, b->work, s));
    }
    ZR_CHECK(zr_stream_sync(s));
    b->t_kernel = (zr_now() - t0) / 3;
    return ZR_OK;
}

zr_status zr_probe_gpu_busy(zr_probe_busy *b, double seconds)
{
    int k = (int)(seconds / (b->t_kernel > 0 ? b->t_kernel : 1e-3)) + 1;
    for (int i = 0; i < k; i++) {
        ZR_CHECK(zr_sumsq_cuda(b->x, b->n, b->sq, b->work, b->s));
    }
    return ZR_OK;
}

void zr_probe_gpu_busy_free(zr_probe_busy *b)
{
    if (b->s == NULL) {
        return;
    }
    const zr_device *dev = zr_stream_device(b->s);
    (void)zr_stream_sync(b->s);
    zr_device_free(dev, b->x);
    zr_device_free(dev, b->sq);
    zr_device_free(dev, b->work);
    memset(b, 0, sizeof *b);
}
