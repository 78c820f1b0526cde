/*
 * lifecycle.c - what happens to a unit between the caller's calls: the
 * stage-3 gathers (started ahead of use within the prefetch and max-live
 * budgets, waited for at fetch, released after use, from the primary shards
 * or the hpZ secondary) and the gradient reductions in flight (started as a
 * unit's backward is done, finished oldest first when reduce_bucket_size
 * elements would be exceeded, folded into the gradient shard).
 *
 * Every decision that changes which collective runs (gather from primary or
 * secondary, prefetch or not) is a function of state that every rank
 * updates identically from the same sequence of calls, so ranks never
 * disagree about the next collective. A dry engine takes the same decisions;
 * only the door (exchange.c) and the payloads differ.
 */
#include "zero_impl.h"

/*
 * The ZeRO-3 baseline (bf16 on the wire, direct all-gather and reduce-scatter
 * over the world) would send 2*S bytes of unit u to every rank on another
 * node for each gather and each reduction zr performs; counting that beside
 * the real traffic shows what ZeRO++ keeps off the links.
 */
static void shadow_zero3(zr_engine *e, const zr_unit_state *s)
{
    int W = e->comm->size[ZR_GROUP_WORLD], D = e->comm->ranks_per_node;
    e->zero3_inter += (uint64_t)2 * s->shard * (uint64_t)(W - D);
}

/* ---- parameter life cycle (stage 3) --------------------------------------- */

/*
 * ZR_SAFE=1: before a gather every rank checks that all ranks chose the same
 * unit and source. A divergence here would otherwise hang in the collective.
 */
static zr_status safe_check(zr_engine *e, int u, int use_secondary)
{
    int64_t v[2] = {(int64_t)u * 2 + use_secondary, -((int64_t)u * 2 + use_secondary)};
    ZR_CHECK(zr_comm_allreduce_max_i64(e->comm, ZR_GROUP_WORLD, v, 2));
    if (v[0] != -v[1]) {
        ZR_FAIL(ZR_ERR_INTERNAL,
                "ranks disagree on the next parameter gather (unit %d, %s); this is a bug in the "
                "caller's schedule or in zr",
                u, use_secondary ? "hpZ secondary" : "primary");
    }
    return ZR_OK;
}

static zr_status start_gather(zr_engine *e, int u)
{
    zr_unit_state *s = &e->units[u];
    int use_secondary = e->plan.secondary && s->sec_valid;
    if (e->safe) {
        ZR_CHECK(safe_check(e, u, use_secondary));
    }
    zr_dtype type = zr_engine_full_type(e);
    if (s->full == NULL) {
        /* the gather writes every element */
        ZR_CHECK(zr_engine_pool_get(e, s->padded * zr_dtype_size(type), 0, &s->full));
    }
    ZR_CHECK(zr_engine_pool_get_op(e->pool, &s->gop));
    zr_wire qwire = {ZR_WIRE_QUANT, e->cfg.qwz_q};
    const zr_wire *wire = e->cfg.qwz ? &qwire : &e->cfg.param_wire;
    if (use_secondary) {
        ZR_CHECK(zr_engine_allgather(e, ZR_GROUP_HPZ, ZR_KIND_HPZ, wire, s->sec_type, s->secondary,
                                     s->sec_count, type, s->full, s->gop));
    } else {
        ZR_CHECK(zr_engine_allgather(e, ZR_GROUP_WORLD,
                                     e->cfg.qwz ? ZR_KIND_QWZ : ZR_KIND_ALLGATHER, wire,
                                     ZR_DTYPE_F32, s->master, s->shard, type, s->full, s->gop));
    }
    zr_engine_pool_account(e->pool);
    s->from_primary = !use_secondary;
    s->inflight = 1;
    shadow_zero3(e, s);
    e->live += s->padded;
    if (e->live > e->live_peak) {
        e->live_peak = e->live;
    }
    return ZR_OK;
}

static void unprefetch(zr_engine *e, zr_unit_state *s)
{
    if (s->prefetched) {
        s->prefetched = 0;
        e->prefetched -= s->padded;
    }
}

zr_status zr_engine_prefetch(zr_engine *e, int u, zr_phase phase)
{
    (void)phase;
    if (u < 0 || u >= e->nunits || e->plan.params != ZR_SHARDED || !e->cfg.overlap) {
        return ZR_OK;
    }
    zr_unit_state *s = &e->units[u];
    if (s->gathered || s->inflight || e->live + s->padded > e->cfg.max_live ||
        e->prefetched + s->padded > e->cfg.prefetch_bucket) {
        return ZR_OK;
    }
    ZR_CHECK(start_gather(e, u));
    s->prefetched = 1;
    e->prefetched += s->padded;
    return ZR_OK;
}

/* Complete the gather in flight into s->full and hand its op back. */
static zr_status wait_gather(zr_engine *e, zr_unit_state *s)
{
    ZR_CHECK(zr_engine_wait(e, s->gop));
    zr_engine_pool_put_op(e->pool, s->gop);
    s->gop = NULL;
    s->inflight = 0;
    s->gathered = 1;
    unprefetch(e, s);
    return ZR_OK;
}

zr_status zr_engine_fetch(zr_engine *e, int u, zr_phase phase, const void **params)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    (void)phase;
    zr_unit_state *s = &e->units[u];
    if (e->plan.params == ZR_SHARDED && !s->gathered) {
        if (!s->inflight) {
            ZR_CHECK(start_gather(e, u));
        }
        ZR_CHECK(wait_gather(e, s));
    }
    *params = s->full;
    return ZR_OK;
}

zr_status zr_engine_release(zr_engine *e, int u)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    zr_unit_state *s = &e->units[u];
    if (e->plan.params != ZR_SHARDED) {
        return ZR_OK;
    }
    if (s->inflight) {
        /* prefetched but never used: the buffer is still being written */
        ZR_CHECK(wait_gather(e, s));
    }
    if (!s->gathered) {
        return ZR_OK;
    }
    if (e->plan.secondary && !s->sec_valid && s->from_primary) {
        zr_dtype type = zr_engine_full_type(e);
        if (zr_engine_is_dry(e)) {
            if (s->sec_type != type) { /* a secondary of the gathered unit's type is a copy */
                zr_engine_report_work(e, ZR_WORK_HPZ_CUT, s->sec_count);
            }
        } else {
            ZR_CHECK(zr_hpz_cut(e->comm, type, s->full, s->sec_count, s->sec_type, s->secondary));
        }
        s->sec_valid = 1;
    }
    zr_engine_pool_put(e->pool, s->full);
    s->full = NULL;
    s->gathered = 0;
    e->live -= s->padded;
    return ZR_OK;
}

/* ---- gradients -------------------------------------------------------------- */

/*
 * Complete the oldest reduction in flight. Sharded gradients: fold the
 * staging buffer into the gradient shard and hand both buffers back.
 */
zr_status zr_engine_finish_oldest(zr_engine *e)
{
    ZR_ASSERT(e->nreducing > 0);
    zr_unit_state *s = &e->units[e->fifo[e->fifo_head]];
    e->fifo_head = (e->fifo_head + 1) % e->nunits;
    e->nreducing--;
    e->reducing -= s->padded;
    s->grad_inflight = 0;
    zr_status st = zr_engine_wait(e, s->rop);
    zr_engine_pool_put_op(e->pool, s->rop);
    s->rop = NULL;
    ZR_CHECK(st);
    if (e->plan.grads == ZR_SHARDED) {
        zr_engine_report_work(e, ZR_WORK_GRAD_FOLD, s->shard);
        ZR_CHECK(zr_engine_buf_add(e, s->grad_shard, s->grad_tmp, s->shard));
        zr_engine_pool_put(e->pool, s->grad_tmp);
        zr_engine_pool_put(e->pool, s->grad_full);
        s->grad_tmp = NULL;
        s->grad_full = NULL;
    }
    return ZR_OK;
}

/* Complete unit s's reduction (and every older one: they finish in start order). */
static zr_status finish_grad(zr_engine *e, zr_unit_state *s)
{
    while (s->grad_inflight) {
        ZR_CHECK(zr_engine_finish_oldest(e));
    }
    return ZR_OK;
}

/*
 * Make room for a reduction of s: finish the oldest ones while the elements
 * in flight would exceed reduce_bucket_size (one is always allowed), then
 * take an op and record s as the newest in flight. The caller starts it.
 */
zr_status zr_engine_reduce_begin(zr_engine *e, zr_unit_state *s)
{
    while (e->nreducing > 0 && e->reducing + s->padded > e->cfg.reduce_bucket) {
        ZR_CHECK(zr_engine_finish_oldest(e));
    }
    ZR_CHECK(zr_engine_pool_get_op(e->pool, &s->rop));
    e->fifo[(e->fifo_head + e->nreducing) % e->nunits] = (int)(s - e->units);
    e->nreducing++;
    e->reducing += s->padded;
    s->grad_inflight = 1;
    return ZR_OK;
}

zr_status zr_engine_micro_begin(zr_engine *e)
{
    if (e->micro == 0) {
        e->t_begin = zr_now();
        e->t_comm = 0.0;
        e->bufs->marks_reset(e);
        e->t_optim = 0.0;
        e->live_peak = e->live;
        e->traffic_begin = zr_comm_traffic_get(e->comm);
        e->zero3_inter = 0;
    }
    e->micro++;
    return ZR_OK;
}

zr_status zr_engine_grads(zr_engine *e, int u, void **grads)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    zr_unit_state *s = &e->units[u];
    ZR_CHECK(finish_grad(e, s));
    if (s->grad_full == NULL) {
        if (e->plan.grads == ZR_SHARDED) {
            zr_engine_report_work(e, ZR_WORK_GRAD_ZERO, s->padded);
            size_t bytes = s->padded * zr_dtype_size(zr_engine_grad_full_type(e));
            ZR_CHECK(zr_engine_pool_get(e, bytes, 1, &s->grad_full));
        } else {
            float *g; /* fp32: it accumulates every micro-batch of the step */
            ZR_ENGINE_ALLOC(e, g, s->padded);
            s->grad_full = g;
        }
    }
    *grads = s->grad_full;
    return ZR_OK;
}

zr_status zr_engine_grads_done(zr_engine *e, int u)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    zr_unit_state *s = &e->units[u];
    ZR_ASSERT(s->grad_full != NULL);
    if (e->plan.grads != ZR_SHARDED) {
        return ZR_OK; /* replicated gradients are reduced once, at the step */
    }
    ZR_CHECK(zr_engine_reduce_begin(e, s));
    /* the reduction writes it whole */
    void *tmp;
    ZR_CHECK(zr_engine_pool_get(e, s->shard * sizeof(float), 0, &tmp));
    s->grad_tmp = tmp;
    zr_dtype type = zr_engine_grad_full_type(e);
    if (e->cfg.qgz) {
        ZR_CHECK(zr_engine_qgz(e, type, s->grad_full, s->shard, s->grad_tmp, &s->fb, s->rop));
    } else {
        ZR_CHECK(zr_engine_reduce_scatter(e, type, s->grad_full, s->shard, s->grad_tmp, s->rop));
    }
    zr_engine_pool_account(e->pool);
    shadow_zero3(e, s);
    if (!e->cfg.overlap) {
        ZR_CHECK(finish_grad(e, s));
    }
    return ZR_OK;
}
