/*
 * buffers.c - where the engine's buffers live and how the engine's own work
 * on them runs, behind one table (zero_impl.h, zr_engine_bufs) chosen once
 * when the engine is placed:
 *
 *   host    host memory, every operation done at once (the MPI transport)
 *   device  the memory of the GPU whose bytes the communicator's data plane
 *           moves (a device transport, zr_comm_device), every operation
 *           queued on the stream the communicator follows (buffers_cuda.c
 *           says why that stream, and how exposed time is measured there)
 *   dry     host tokens: nothing is ever queued or computed for a dry
 *           engine; its waits are reported to its observer
 *
 * Same bits on the host and the device: the device's fold and AdamW run the
 * host's rules; only the order in which the gradient norm's squares are
 * added differs (buffers_cuda.c).
 */
#include "zero_impl.h"

#include "zr/optim.h"

#include <string.h>

/* ---- placement ----------------------------------------------------------------- */

/* The table of each device kind; a dry engine has its own whatever the communicator. */
static const zr_engine_bufs *const by_kind[] = {
    [ZR_DEVICE_CPU] = &zr_engine_bufs_host,
    [ZR_DEVICE_CUDA] = &zr_engine_bufs_cuda,
};

zr_status zr_engine_place(zr_engine *e)
{
    zr_stream *s = NULL;
    const zr_device *d = zr_engine_is_dry(e) ? NULL : zr_comm_device(e->comm, &s);
    e->on_device = d != NULL;
    e->device = d != NULL ? *d : zr_device_cpu();
    e->bufs = zr_engine_is_dry(e) ? &zr_engine_bufs_dry : by_kind[e->device.kind];
    return e->bufs->place(e, s);
}

void zr_engine_unplace(zr_engine *e)
{
    if (e->bufs != NULL) { /* NULL: setup failed before placing */
        e->bufs->unplace(e);
    }
}

/* ---- what the host and a dry engine share ------------------------------------------ */

static zr_status none_place(zr_engine *e, zr_stream *follow)
{
    (void)e;
    (void)follow;
    return ZR_OK;
}

static void none_unplace(zr_engine *e)
{
    (void)e;
}

static void host_free(zr_engine *e, void *p)
{
    (void)e;
    zr_free(p);
}

static zr_status none_sync(zr_engine *e)
{
    (void)e;
    return ZR_OK;
}

static zr_status none_sumsq_finish(zr_engine *e, double *sq)
{
    (void)e;
    (void)sq;
    return ZR_OK;
}

static void none_marks_reset(zr_engine *e)
{
    (void)e;
}

static zr_status none_exposed(zr_engine *e)
{
    (void)e;
    return ZR_OK;
}

/* ---- host ------------------------------------------------------------------------ */

static zr_status host_alloc(zr_engine *e, void **p, size_t bytes, const char *file, int line)
{
    (void)e;
    return zr_alloc_at(p, bytes, file, line);
}

static zr_status host_zero(zr_engine *e, void *p, size_t bytes)
{
    (void)e;
    if (bytes > 0) {
        memset(p, 0, bytes);
    }
    return ZR_OK;
}

static zr_status host_copy(zr_engine *e, void *dst, const void *src, size_t bytes)
{
    (void)e;
    if (bytes > 0 && dst != src) {
        memcpy(dst, src, bytes);
    }
    return ZR_OK;
}

static zr_status host_add(zr_engine *e, float *acc, const float *x, size_t n)
{
    (void)e;
    for (size_t i = 0; i < n; i++) {
        acc[i] += x[i];
    }
    return ZR_OK;
}

static zr_status host_adamw(zr_engine *e, const zr_adamw *h, float lr, float grad_scale, int decay,
                            float *param, const float *grad, float *m, float *v, size_t n)
{
    zr_adamw_update(h, lr, e->step, grad_scale, decay, param, grad, m, v, n);
    return ZR_OK;
}

static zr_status host_sumsq(zr_engine *e, int u, const float *x, size_t n, double *sq)
{
    (void)e;
    (void)u;
    *sq += zr_sumsq(x, n);
    return ZR_OK;
}

/* The host's blocked time is what it lost: the wall clock since `since`. */
static zr_status host_wait(zr_engine *e, zr_coll_op *op, double since)
{
    zr_status st = zr_coll_wait(e->comm, op);
    e->t_comm += zr_now() - since;
    return st;
}

const zr_engine_bufs zr_engine_bufs_host = {
    .name = "host",
    .place = none_place,
    .unplace = none_unplace,
    .alloc = host_alloc,
    .free = host_free,
    .zero = host_zero,
    .copy = host_copy,
    .sync = none_sync,
    .add = host_add,
    .adamw = host_adamw,
    .sumsq = host_sumsq,
    .sumsq_finish = none_sumsq_finish,
    .wait = host_wait,
    .marks_reset = none_marks_reset,
    .exposed = none_exposed,
};

/* ---- dry ------------------------------------------------------------------------- */

/* A token: sizes are tracked by the pool, payloads are not held. */
static zr_status dry_alloc(zr_engine *e, void **p, size_t bytes, const char *file, int line)
{
    (void)e;
    (void)bytes;
    return zr_alloc_at(p, sizeof(float), file, line);
}

static zr_status dry_zero(zr_engine *e, void *p, size_t bytes)
{
    (void)e;
    (void)p;
    (void)bytes;
    return ZR_OK;
}

static zr_status dry_copy(zr_engine *e, void *dst, const void *src, size_t bytes)
{
    (void)e;
    (void)dst;
    (void)src;
    (void)bytes;
    return ZR_OK;
}

static zr_status dry_add(zr_engine *e, float *acc, const float *x, size_t n)
{
    (void)e;
    (void)acc;
    (void)x;
    (void)n;
    return ZR_OK;
}

static zr_status dry_adamw(zr_engine *e, const zr_adamw *h, float lr, float grad_scale, int decay,
                           float *param, const float *grad, float *m, float *v, size_t n)
{
    (void)e;
    (void)h;
    (void)lr;
    (void)grad_scale;
    (void)decay;
    (void)param;
    (void)grad;
    (void)m;
    (void)v;
    (void)n;
    return ZR_OK;
}

static zr_status dry_sumsq(zr_engine *e, int u, const float *x, size_t n, double *sq)
{
    (void)e;
    (void)u;
    (void)x;
    (void)n;
    (void)sq;
    return ZR_OK;
}

/* A dry collective is complete when the engine waits for it (exchange.c); the time counted is
   the observer's, as the host counts its own. */
static zr_status dry_wait(zr_engine *e, zr_coll_op *op, double since)
{
    zr_engine_event ev = {.type = ZR_ENGINE_WAIT, .op = op};
    e->dry.event(e->dry.ctx, &ev);
    e->t_comm += zr_now() - since;
    return ZR_OK;
}

const zr_engine_bufs zr_engine_bufs_dry = {
    .name = "dry",
    .place = none_place,
    .unplace = none_unplace,
    .alloc = dry_alloc,
    .free = host_free,
    .zero = dry_zero,
    .copy = dry_copy,
    .sync = none_sync,
    .add = dry_add,
    .adamw = dry_adamw,
    .sumsq = dry_sumsq,
    .sumsq_finish = none_sumsq_finish,
    .wait = dry_wait,
    .marks_reset = none_marks_reset,
    .exposed = none_exposed,
};
