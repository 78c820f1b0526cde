/*
 * buffers_cuda.c - zr_engine_bufs_cuda: the engine's buffers in the
 * memory of the GPU whose bytes the communicator's data plane moves (a
 * device transport, zr_comm_device), its work queued on the stream the
 * communicator follows. It calls only zr_* APIs every build has (a build
 * without CUDA never places an engine here: zr_comm_device is NULL there).
 *
 * Why that stream: it is the caller's compute stream (the model's kernels
 * read the gathered parameters and write the gradients there), and every
 * collective starts after the work queued on it (zr/coll.h). So a zeroed
 * gradient buffer, a folded shard or an AdamW update queued here is ordered
 * before the collective that reads it and after the kernels that wrote its
 * inputs, with no host wait; a buffer handed back to the pool and reused by
 * a later gather is written only after the kernels queued before that
 * gather started, which include every reader of its previous contents. The
 * host waits only where it reads: the step's sums of squares (one small
 * copy per step) and the copies out to host memory (parameters out,
 * checkpoints).
 *
 * Same bits as the host engine: the device's fold is zr_quant_cuda_add (the
 * CPU's acc[i] += x[i]), its AdamW zr_adamw_cuda_update (the CPU's rules);
 * only the order in which the gradient norm's squares are added differs
 * (zr_sumsq_cuda's fixed tree against zr_sumsq's), which moves the norm by
 * an ulp or so of a double.
 *
 * Exposed communication on a device: the host blocks in a collective's wait
 * while the GPU may still be computing what was queued before, so the
 * host's blocked time is not what the GPU lost. The engine marks the stream
 * with an event just before such a wait and another just after: nothing is
 * queued between them, so the GPU time between the two marks is the time
 * the stream sat idle, with its work done, waiting for the host to hand it
 * the next unit, that is for the collective. Their sum over a step, read
 * once the step's work has run, is the step's exposed communication.
 */
#include "zero_impl.h"

#include "zr/optim.h"
#include "zr/quant_cuda.h"

#include <string.h>

/* What the device instance keeps per engine (e->scratch). */
struct zr_engine_scratch {
    double *dev;  /* device: one sum of squares per unit */
    double *work; /* device: zr_sumsq_cuda's partials */
    double *host; /* pinned: the sums, read once per step */
    /* the stream marked before and after each host wait of this step (pairs) */
    zr_event **marks;
    int nmarks, cap_marks;
};

/* The stream the engine's work is queued on: the one the communicator follows. */
static zr_stream *stream_of(const zr_engine *e)
{
    zr_stream *s = NULL;
    (void)zr_comm_device(e->comm, &s);
    return s;
}

static zr_status dev_place(zr_engine *e, zr_stream *follow)
{
    if (follow == NULL) {
        ZR_FAIL(ZR_ERR_INVALID,
                "a ZeRO engine on %s needs the communicator to follow a stream "
                "(zr_comm_device_follow): the caller's compute stream",
                e->device.name);
    }
    zr_engine_scratch *n;
    ZR_ALLOC(n, 1);
    e->scratch = n;
    size_t units = (size_t)e->nunits;
    ZR_CHECK(zr_device_alloc_at(&e->device, (void **)&n->dev, units * sizeof(double), __FILE__,
                                __LINE__));
    ZR_CHECK(zr_device_alloc_at(&e->device, (void **)&n->work, ZR_SUMSQ_CUDA_WORK * sizeof(double),
                                __FILE__, __LINE__));
    return zr_host_alloc_pinned_at(&e->device, (void **)&n->host, units * sizeof(double), __FILE__,
                                   __LINE__);
}

static void dev_unplace(zr_engine *e)
{
    zr_engine_scratch *n = e->scratch;
    if (n == NULL) {
        return;
    }
    zr_device_free(&e->device, n->dev);
    zr_device_free(&e->device, n->work);
    zr_host_free_pinned(&e->device, n->host);
    for (int i = 0; i < n->cap_marks; i++) {
        zr_event_destroy(n->marks[i]);
    }
    zr_free(n->marks);
    zr_free(n);
    e->scratch = NULL;
}

static zr_status dev_alloc(zr_engine *e, void **p, size_t bytes, const char *file, int line)
{
    ZR_CHECK(zr_device_alloc_at(&e->device, p, bytes, file, line));
    /* device memory comes unset; the engine's buffers start at zero, as on the host */
    return zr_memset_async(*p, 0, bytes, stream_of(e));
}

static void dev_free(zr_engine *e, void *p)
{
    zr_device_free(&e->device, p);
}

static zr_status dev_zero(zr_engine *e, void *p, size_t bytes)
{
    if (bytes == 0) {
        return ZR_OK;
    }
    return zr_memset_async(p, 0, bytes, stream_of(e));
}

static zr_status dev_copy(zr_engine *e, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0 || dst == src) {
        return ZR_OK;
    }
    return zr_memcpy_async(dst, src, bytes, stream_of(e));
}

static zr_status dev_sync(zr_engine *e)
{
    return zr_stream_sync(stream_of(e));
}

static zr_status dev_add(zr_engine *e, float *acc, const float *x, size_t n)
{
    return zr_quant_cuda_add(acc, x, ZR_DTYPE_F32, n, stream_of(e));
}

static zr_status dev_adamw(zr_engine *e, const zr_adamw *h, float lr, float grad_scale, int decay,
                           float *param, const float *grad, float *m, float *v, size_t n)
{
    return zr_adamw_cuda_update(h, lr, e->step, grad_scale, decay, param, grad, m, v, n,
                                stream_of(e));
}

static zr_status dev_sumsq(zr_engine *e, int u, const float *x, size_t n, double *sq)
{
    (void)sq; /* added by dev_sumsq_finish */
    zr_engine_scratch *nm = e->scratch;
    return zr_sumsq_cuda(x, n, nm->dev + u, nm->work, stream_of(e));
}

static zr_status dev_sumsq_finish(zr_engine *e, double *sq)
{
    zr_engine_scratch *nm = e->scratch;
    zr_stream *s = stream_of(e);
    ZR_CHECK(zr_memcpy_async(nm->host, nm->dev, (size_t)e->nunits * sizeof(double), s));
    ZR_CHECK(zr_stream_sync(s));
    for (int u = 0; u < e->nunits; u++) {
        *sq += nm->host[u]; /* in unit order, as the host engine adds */
    }
    return ZR_OK;
}

/* Mark the stream (one of a pair around a host wait). */
static zr_status mark(zr_engine *e)
{
    zr_engine_scratch *g = e->scratch;
    if (g->nmarks == g->cap_marks) {
        int cap = g->cap_marks < 16 ? 16 : 2 * g->cap_marks;
        zr_event **n;
        ZR_ALLOC(n, (size_t)cap);
        if (g->cap_marks > 0) {
            memcpy(n, g->marks, (size_t)g->cap_marks * sizeof *n);
        }
        zr_free(g->marks);
        g->marks = n;
        for (; g->cap_marks < cap; g->cap_marks++) {
            ZR_CHECK(zr_event_create(&e->device, &g->marks[g->cap_marks]));
        }
    }
    return zr_event_record(g->marks[g->nmarks++], stream_of(e));
}

/* The GPU's idle time between the marks is what counts (the head of this file). */
static zr_status dev_wait(zr_engine *e, zr_coll_op *op, double since)
{
    (void)since;
    ZR_CHECK(mark(e));
    zr_status st = zr_coll_wait(e->comm, op);
    zr_status second = mark(e); /* marks come in pairs, whatever the wait gave */
    return st != ZR_OK ? st : second;
}

static void dev_marks_reset(zr_engine *e)
{
    e->scratch->nmarks = 0;
}

static zr_status dev_exposed(zr_engine *e)
{
    zr_engine_scratch *g = e->scratch;
    double seconds = 0.0;
    for (int i = 0; i + 1 < g->nmarks; i += 2) {
        float ms = 0.0f;
        ZR_CHECK(zr_event_elapsed_ms(g->marks[i], g->marks[i + 1], &ms));
        seconds += ms * 1e-3;
    }
    g->nmarks = 0;
    e->t_comm = seconds;
    return ZR_OK;
}

const zr_engine_bufs zr_engine_bufs_cuda = {
    .name = "cuda",
    .place = dev_place,
    .unplace = dev_unplace,
    .alloc = dev_alloc,
    .free = dev_free,
    .zero = dev_zero,
    .copy = dev_copy,
    .sync = dev_sync,
    .add = dev_add,
    .adamw = dev_adamw,
    .sumsq = dev_sumsq,
    .sumsq_finish = dev_sumsq_finish,
    .wait = dev_wait,
    .marks_reset = dev_marks_reset,
    .exposed = dev_exposed,
};
