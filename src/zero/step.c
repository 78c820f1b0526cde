/*
 * step.c - the optimizer step: the reductions still to do (all of them at
 * stages 0 and 1, whose gradients stay local until here), the global
 * gradient norm, a step skipped on every rank when it is not finite,
 * clipping, AdamW on this rank's slice, the refresh of replicated working
 * parameters from the new shards, and the per-step statistics.
 *
 * A dry engine reports the CPU work of the norm, AdamW and the clearing
 * instead of doing it, and takes every step (its gradients are finite).
 * A device engine queues that work on its stream (buffers_cuda.c) and waits for
 * it twice: for the sums of squares of the norm, and at the end of the step,
 * so that the step's times include the device's work.
 */
#include "zero_impl.h"

#include "zr/optim.h"

#include <math.h>

/* Reduce the gradients that are still local: all of them at stages 0 and 1. */
static zr_status reduce_replicated_grads(zr_engine *e)
{
    for (int u = 0; u < e->nunits; u++) {
        zr_unit_state *s = &e->units[u];
        if (e->plan.grads == ZR_SHARDED) {
            if (s->grad_full != NULL && !s->grad_inflight) {
                ZR_FAIL(ZR_ERR_INVALID,
                        "unit %d has a gradient buffer that was never handed back with "
                        "zr_engine_grads_done",
                        u);
            }
            continue;
        }
        if (s->grad_full == NULL) {
            /* a unit that got no gradient this step still takes part in the reduction */
            float *g;
            ZR_ENGINE_ALLOC(e, g, s->padded);
            s->grad_full = g;
        }
        /* replicated gradients are fp32 in every work type (engine.c) */
        ZR_CHECK(zr_engine_reduce_begin(e, s));
        if (e->plan.optim == ZR_SHARDED) {
            ZR_CHECK(zr_engine_reduce_scatter(e, ZR_DTYPE_F32, s->grad_full, s->shard, s->grad_tmp,
                                              s->rop));
        } else {
            ZR_CHECK(zr_engine_allreduce(e, s->grad_full, s->padded, s->rop));
        }
        zr_engine_pool_account(e->pool);
    }
    while (e->nreducing > 0) {
        ZR_CHECK(zr_engine_finish_oldest(e));
    }
    return ZR_OK;
}

/* This rank's slice of unit u's reduced gradient (shard elements). */
static const float *grad_slice(const zr_engine *e, const zr_unit_state *s)
{
    if (e->plan.grads == ZR_SHARDED) {
        return s->grad_shard;
    }
    if (e->plan.optim == ZR_SHARDED) {
        return s->grad_tmp; /* stage 1: reduce-scattered at the step */
    }
    return (const float *)s->grad_full + (size_t)zr_engine_rank(e) * s->shard;
}

/* AdamW on this rank's slice of s; *n += the elements updated. */
static zr_status adamw_unit(zr_engine *e, zr_unit_state *s, float lr, float grad_scale, size_t *n)
{
    zr_adamw h = {lr, e->cfg.beta1, e->cfg.beta2, e->cfg.eps, e->cfg.weight_decay};
    int dry = zr_engine_is_dry(e);
    /* the element range this rank updates, in unit coordinates */
    size_t lo = 0, hi = s->padded;
    const float *g = NULL;
    float *master = NULL, *m = NULL, *v = NULL;
    if (e->plan.optim == ZR_SHARDED) {
        lo = (size_t)zr_engine_rank(e) * s->shard;
        hi = lo + s->shard;
    }
    if (!dry && e->plan.optim == ZR_SHARDED) {
        g = grad_slice(e, s) - lo;
        master = s->master - lo;
        m = s->m - lo;
        v = s->v - lo;
    } else if (!dry) {
        g = s->grad_full;
        master = s->master;
        m = s->m;
        v = s->v;
    }
    for (int i = 0; i < s->nranges; i++) {
        size_t a = s->ranges[i].offset, b = a + s->ranges[i].numel;
        if (a < lo) {
            a = lo;
        }
        if (b > hi) {
            b = hi;
        }
        if (a < b && !dry) {
            ZR_CHECK(e->bufs->adamw(e, &h, lr, grad_scale, s->ranges[i].decay, master + a, g + a,
                                    m + a, v + a, b - a));
        }
        *n += a < b ? b - a : 0;
    }
    return ZR_OK;
}

/* The global norm of the averaged gradient (each rank sums its slice); dry: its work. */
static zr_status grad_norm(zr_engine *e, double *norm)
{
    double sq = 0.0;
    size_t n = 0;
    for (int u = 0; u < e->nunits; u++) {
        n += e->units[u].shard;
        if (!zr_engine_is_dry(e)) {
            ZR_CHECK(e->bufs->sumsq(e, u, grad_slice(e, &e->units[u]), e->units[u].shard, &sq));
        }
    }
    ZR_CHECK(e->bufs->sumsq_finish(e, &sq));
    zr_engine_report_work(e, ZR_WORK_NORM, n);
    if (!zr_engine_is_dry(e)) {
        /* control values: not data traffic, and no part of a dry run's report */
        ZR_CHECK(zr_comm_allreduce_sum_f64(e->comm, ZR_GROUP_WORLD, &sq, 1));
    }
    *norm = sqrt(sq) * (1.0 / (double)e->micro);
    return ZR_OK;
}

/* Refresh unit s's replicated working copy from the new shard and clear its gradients. */
static zr_status refresh_and_clear(zr_engine *e, zr_unit_state *s, int finite)
{
    if (finite && e->plan.params == ZR_REPLICATED && !s->full_is_master) {
        ZR_CHECK(zr_engine_refresh_full(e, s));
    }
    if (s->grad_shard != NULL) {
        zr_engine_report_work(e, ZR_WORK_CLEAR, s->shard);
        ZR_CHECK(zr_engine_buf_zero(e, s->grad_shard, s->shard * sizeof(float)));
    }
    if (e->plan.grads == ZR_REPLICATED && s->grad_full != NULL) {
        zr_engine_report_work(e, ZR_WORK_CLEAR, s->padded);
        ZR_CHECK(zr_engine_buf_zero(e, s->grad_full, s->padded * sizeof(float)));
    }
    return ZR_OK;
}

static void fill_stats(zr_engine *e, zr_step_stats *stats)
{
    stats->t_comm = e->t_comm;
    stats->t_optim = e->t_optim;
    stats->t_total = zr_now() - e->t_begin;
    stats->live_peak = e->live_peak;
    stats->zero3_bytes_inter = e->zero3_inter;
    zr_traffic now = zr_comm_traffic_get(e->comm);
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        stats->traffic.kind[k].calls = now.kind[k].calls - e->traffic_begin.kind[k].calls;
        stats->traffic.kind[k].bytes_intra =
            now.kind[k].bytes_intra - e->traffic_begin.kind[k].bytes_intra;
        stats->traffic.kind[k].bytes_inter =
            now.kind[k].bytes_inter - e->traffic_begin.kind[k].bytes_inter;
    }
}

zr_status zr_engine_step(zr_engine *e, float lr, zr_step_stats *stats)
{
    if (e->micro == 0) {
        ZR_FAIL(ZR_ERR_INVALID, "zr_engine_step called before any micro-batch");
    }
    ZR_CHECK(reduce_replicated_grads(e));
    double norm;
    ZR_CHECK(grad_norm(e, &norm));
    int finite = isfinite(norm);
    stats->grad_norm = norm;
    stats->skipped = !finite;

    double t0 = zr_now();
    if (finite) {
        e->step++;
        float scale = zr_clip_scale(norm, e->cfg.grad_clip) * (float)(1.0 / (double)e->micro);
        size_t n = 0;
        for (int u = 0; u < e->nunits; u++) {
            ZR_CHECK(adamw_unit(e, &e->units[u], lr, scale, &n));
        }
        /* the optimizer's time is the device's too */
        ZR_CHECK(zr_engine_buf_sync(e));
        zr_engine_report_work(e, ZR_WORK_ADAMW, n);
    }
    /* a skipped step is the caller's to report (stats->skipped): the engine counts optimizer
       steps (e->step), not the caller's steps, and would name the wrong one */
    e->t_optim += zr_now() - t0;

    for (int u = 0; u < e->nunits; u++) {
        ZR_CHECK(refresh_and_clear(e, &e->units[u], finite));
    }
    if (finite) {
        zr_engine_invalidate_secondary(e);
    }
    /* the step's time is the device's too: its clears have run when it returns */
    ZR_CHECK(zr_engine_buf_sync(e));
    ZR_CHECK(e->bufs->exposed(e));
    e->micro = 0;
    fill_stats(e, stats);
    return ZR_OK;
}
