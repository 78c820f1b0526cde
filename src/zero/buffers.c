/*
 * buffers.c - where the engine's buffers live and how the engine's own work
 * on them runs: in host memory, done at once, or in the memory of the GPU
 * whose bytes the communicator's data plane moves (a device transport,
 * zr_comm_device), queued on the stream the communicator follows.
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
 *
 * A dry engine's buffers are host tokens: nothing is ever queued for it.
 */
#include "zero_impl.h"

#include "zr/optim.h"
#include "zr/quant_cuda.h"

#include <string.h>

struct zr_engine_gpu {
    double *dev;  /* device: one sum of squares per unit */
    double *work; /* device: zr_sumsq_cuda's partials */
    double *host; /* pinned: the sums, read once per step */
    /* the stream marked before and after each host wait of this step (pairs) */
    zr_event **marks;
    int nmarks, cap_marks;
};

static int on_device(const zr_engine *e)
{
    return e->on_device && !zr_engine_is_dry(e);
}

zr_stream *zr_engine_stream(const zr_engine *e)
{
    zr_stream *s = NULL;
    (void)zr_comm_device(e->comm, &s);
    return s;
}

zr_status zr_engine_place(zr_engine *e)
{
    zr_stream *s = NULL;
    const zr_device *d = zr_engine_is_dry(e) ? NULL : zr_comm_device(e->comm, &s);
    e->on_device = d != NULL;
    e->device = d != NULL ? *d : zr_device_cpu();
    if (!e->on_device) {
        return ZR_OK;
    }
    if (s == NULL) {
        ZR_FAIL(ZR_ERR_INVALID,
                "a ZeRO engine on %s needs the communicator to follow a stream "
                "(zr_comm_device_follow): the caller's compute stream",
                e->device.name);
    }
    zr_engine_gpu *n;
    ZR_ALLOC(n, 1);
    e->gpu = n;
    size_t units = (size_t)e->nunits;
    ZR_CHECK(zr_device_alloc_at(&e->device, (void **)&n->dev, units * sizeof(double), __FILE__,
                                __LINE__));
    ZR_CHECK(zr_device_alloc_at(&e->device, (void **)&n->work, ZR_SUMSQ_CUDA_WORK * sizeof(double),
                                __FILE__, __LINE__));
    return zr_host_alloc_pinned_at(&e->device, (void **)&n->host, units * sizeof(double), __FILE__,
                                   __LINE__);
}

void zr_engine_unplace(zr_engine *e)
{
    zr_engine_gpu *n = e->gpu;
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
    e->gpu = NULL;
}

zr_status zr_engine_buf_alloc(zr_engine *e, void **p, size_t bytes, const char *file, int line)
{
    if (!on_device(e)) {
        return zr_alloc_at(p, zr_engine_is_dry(e) ? sizeof(float) : bytes, file, line);
    }
    ZR_CHECK(zr_device_alloc_at(&e->device, p, bytes, file, line));
    /* device memory comes unset; the engine's buffers start at zero, as on the host */
    return zr_memset_async(*p, 0, bytes, zr_engine_stream(e));
}

void zr_engine_buf_free(zr_engine *e, void *p)
{
    if (on_device(e)) {
        zr_device_free(&e->device, p);
    } else {
        zr_free(p);
    }
}

zr_status zr_engine_buf_zero(zr_engine *e, void *p, size_t bytes)
{
    if (zr_engine_is_dry(e) || bytes == 0) {
        return ZR_OK;
    }
    if (!on_device(e)) {
        memset(p, 0, bytes);
        return ZR_OK;
    }
    return zr_memset_async(p, 0, bytes, zr_engine_stream(e));
}

zr_status zr_engine_buf_copy(zr_engine *e, void *dst, const void *src, size_t bytes)
{
    if (zr_engine_is_dry(e) || bytes == 0 || dst == src) {
        return ZR_OK;
    }
    if (!on_device(e)) {
        memcpy(dst, src, bytes);
        return ZR_OK;
    }
    return zr_memcpy_async(dst, src, bytes, zr_engine_stream(e));
}

zr_status zr_engine_buf_sync(zr_engine *e)
{
    if (!on_device(e)) {
        return ZR_OK;
    }
    return zr_stream_sync(zr_engine_stream(e));
}

zr_status zr_engine_buf_add(zr_engine *e, float *acc, const float *x, size_t n)
{
    if (zr_engine_is_dry(e)) {
        return ZR_OK;
    }
    if (on_device(e)) {
        return zr_quant_cuda_add(acc, x, ZR_DTYPE_F32, n, zr_engine_stream(e));
    }
    for (size_t i = 0; i < n; i++) {
        acc[i] += x[i];
    }
    return ZR_OK;
}

zr_status zr_engine_buf_adamw(zr_engine *e, const zr_adamw *h, float lr, float grad_scale,
                              int decay, float *param, const float *grad, float *m, float *v,
                              size_t n)
{
    if (zr_engine_is_dry(e)) {
        return ZR_OK;
    }
    if (on_device(e)) {
        return zr_adamw_cuda_update(h, lr, e->step, grad_scale, decay, param, grad, m, v, n,
                                    zr_engine_stream(e));
    }
    zr_adamw_update(h, lr, e->step, grad_scale, decay, param, grad, m, v, n);
    return ZR_OK;
}

zr_status zr_engine_buf_sumsq(zr_engine *e, int u, const float *x, size_t n, double *sq)
{
    if (zr_engine_is_dry(e)) {
        return ZR_OK;
    }
    if (!on_device(e)) {
        *sq += zr_sumsq(x, n);
        return ZR_OK;
    }
    zr_engine_gpu *nm = e->gpu;
    return zr_sumsq_cuda(x, n, nm->dev + u, nm->work, zr_engine_stream(e));
}

zr_status zr_engine_buf_sumsq_finish(zr_engine *e, double *sq)
{
    if (!on_device(e)) {
        return ZR_OK;
    }
    zr_engine_gpu *nm = e->gpu;
    zr_stream *s = zr_engine_stream(e);
    ZR_CHECK(zr_memcpy_async(nm->host, nm->dev, (size_t)e->nunits * sizeof(double), s));
    ZR_CHECK(zr_stream_sync(s));
    for (int u = 0; u < e->nunits; u++) {
        *sq += nm->host[u]; /* in unit order, as the host engine adds */
    }
    return ZR_OK;
}

zr_status zr_engine_buf_mark(zr_engine *e)
{
    if (!on_device(e)) {
        return ZR_OK;
    }
    zr_engine_gpu *g = e->gpu;
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
    return zr_event_record(g->marks[g->nmarks++], zr_engine_stream(e));
}

void zr_engine_buf_marks_reset(zr_engine *e)
{
    if (on_device(e)) {
        e->gpu->nmarks = 0;
    }
}

zr_status zr_engine_buf_exposed(zr_engine *e, double *seconds)
{
    *seconds = 0.0;
    if (!on_device(e)) {
        return ZR_OK;
    }
    zr_engine_gpu *g = e->gpu;
    for (int i = 0; i + 1 < g->nmarks; i += 2) {
        float ms = 0.0f;
        ZR_CHECK(zr_event_elapsed_ms(g->marks[i], g->marks[i + 1], &ms));
        *seconds += ms * 1e-3;
    }
    g->nmarks = 0;
    return ZR_OK;
}
