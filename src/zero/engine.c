/*
 * engine.c - the ZeRO engine: one code path for stages 0-3 and ZeRO++,
 * driven by the sharding plan (zr_plan) rather than by per-stage branches
 * wherever the plan can say it.
 *
 * Life of a unit's state (W ranks, padded unit of P = W*S elements):
 *
 *   optimizer   master, m, v: S floats each when sharded, P when replicated
 *   params      replicated: `full` (P floats) lives for the whole run; with a
 *               replicated optimizer it is the master itself.
 *               sharded (stage 3): `full` exists only between a gather and
 *               its release; the master shard is the working shard.
 *   secondary   hpZ: P/h elements (bf16 unless the wire is fp32), cut at the
 *               first release after a primary gather, dropped at every step
 *   grads       replicated: `grad_full` (P) accumulates all micro-batches.
 *               sharded: `grad_full` lives from zr_engine_grads until its
 *               reduce-scatter (or qgZ) completes; the result lands in a
 *               staging buffer `grad_tmp` (S) and is added into `grad_shard`
 *               (S), which accumulates the micro-batches: one float per
 *               shard element stays between reductions.
 *
 * Transient memory comes from one pool per engine: gathered units, gradient
 * buffers and staging buffers being reduced, and the collective ops with
 * their workspaces are taken from it and handed back, never freed during a
 * run. A buffer is reused for a request of its size (or up to 1/8 smaller),
 * so the pool holds, per size, the most buffers of that size ever in use at
 * once: after the first step it stops growing, and it does not grow with
 * the number of units. What is in use at once is bounded by the budgets:
 * gathers by stage3_max_live_parameters / stage3_prefetch_bucket_size (plus
 * what the caller holds), reductions in flight by reduce_bucket_size
 * (elements; the oldest is finished before a new one would exceed it, and
 * one is always allowed).
 *
 * Every decision that changes which collective runs (gather from primary or
 * secondary, prefetch or not) is a function of state that every rank
 * updates identically from the same sequence of calls, so ranks never
 * disagree about the next collective.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/zero.h"

#include "zr/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct zr_unit_state {
    size_t numel, padded, shard;
    int nranges;
    const zr_range *ranges;

    float *full;        /* owned; see the file comment for its lifetime */
    int full_is_master; /* full aliases master (stage 0) */
    int gathered;       /* stage 3: full holds the current parameters */
    int inflight;       /* stage 3: a gather into full is in flight */
    int from_primary;   /* the gather in full came from the primary shards */
    int prefetched;     /* the gather was started ahead of use (counts in e->prefetched) */
    zr_coll_op *gop;    /* pooled; the gather in flight into full */

    void *secondary; /* owned; hpZ slice, sec_count elements of sec_type */
    size_t sec_count;
    zr_dtype sec_type;
    int sec_valid;

    float *grad_full;  /* owned (replicated grads) or pooled (sharded) */
    float *grad_shard; /* owned; sharded grads: S floats */
    float *grad_tmp;   /* reduce-scatter output, S floats: owned (stage 1) or pooled */
    int grad_inflight;
    zr_coll_op *rop; /* pooled; the reduction in flight */
    zr_qgz_feedback fb;

    float *master, *m, *v; /* owned; S or P floats each */
};

/* ---- the pool of transient buffers and collective ops ------------------------ */

typedef struct pool_buf {
    float *ptr;
    size_t cap; /* floats */
    int busy;
} pool_buf;

typedef struct pool_op {
    zr_coll_op op;
    int busy;
} pool_op;

struct zr_engine_pool {
    pool_buf *bufs;
    int nbufs, cap_bufs;
    pool_op **ops; /* ops do not move: the collective layer keeps pointers to them */
    int nops, cap_ops;
    size_t buf_bytes; /* pooled buffers, busy or not */
    size_t now, peak; /* buffers + op workspaces */
};

/* Grow an array of elem-byte entries from *cap to at least need entries. */
static zr_status grow_array(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap) {
        return ZR_OK;
    }
    int ncap = *cap < 8 ? 8 : *cap * 2;
    while (ncap < need) {
        ncap *= 2;
    }
    void *n;
    ZR_CHECK(zr_alloc_at(&n, (size_t)ncap * elem, __FILE__, __LINE__));
    if (*arr != NULL) {
        memcpy(n, *arr, (size_t)*cap * elem);
    }
    zr_free(*arr);
    *arr = n;
    *cap = ncap;
    return ZR_OK;
}

static void pool_account(zr_engine_pool *p)
{
    size_t now = p->buf_bytes;
    for (int i = 0; i < p->nops; i++) {
        now += p->ops[i]->op.work_cap;
    }
    p->now = now;
    if (now > p->peak) {
        p->peak = now;
    }
}

/* A buffer of at least n floats, zeroed if asked; reused when one of close size is free. */
static zr_status pool_get(zr_engine_pool *p, size_t n, int zero, float **out)
{
    int best = -1;
    for (int i = 0; i < p->nbufs; i++) {
        pool_buf *b = &p->bufs[i];
        if (!b->busy && b->cap >= n && b->cap - n <= n / 8 &&
            (best < 0 || b->cap < p->bufs[best].cap)) {
            best = i;
        }
    }
    if (best < 0) {
        ZR_CHECK(grow_array((void **)&p->bufs, &p->cap_bufs, p->nbufs + 1, sizeof(pool_buf)));
        pool_buf *b = &p->bufs[p->nbufs];
        ZR_CHECK(
            zr_alloc_at((void **)&b->ptr, (n == 0 ? 1 : n) * sizeof(float), __FILE__, __LINE__));
        b->cap = n;
        b->busy = 0;
        best = p->nbufs++;
        p->buf_bytes += n * sizeof(float);
        pool_account(p);
        zero = 0; /* fresh allocations are zero */
    }
    pool_buf *b = &p->bufs[best];
    b->busy = 1;
    if (zero) {
        memset(b->ptr, 0, n * sizeof(float));
    }
    *out = b->ptr;
    return ZR_OK;
}

static void pool_put(zr_engine_pool *p, float *ptr)
{
    if (ptr == NULL) {
        return;
    }
    for (int i = 0; i < p->nbufs; i++) {
        if (p->bufs[i].ptr == ptr) {
            ZR_ASSERT(p->bufs[i].busy);
            p->bufs[i].busy = 0;
            return;
        }
    }
    ZR_ASSERT(!"buffer handed back to a pool that does not own it");
}

/* An idle collective op; the most recently used first (its workspace is warm). */
static zr_status pool_get_op(zr_engine_pool *p, zr_coll_op **out)
{
    for (int i = p->nops - 1; i >= 0; i--) {
        if (!p->ops[i]->busy) {
            p->ops[i]->busy = 1;
            *out = &p->ops[i]->op;
            return ZR_OK;
        }
    }
    ZR_CHECK(grow_array((void **)&p->ops, &p->cap_ops, p->nops + 1, sizeof(pool_op *)));
    pool_op *o;
    ZR_ALLOC(o, 1);
    o->busy = 1;
    p->ops[p->nops++] = o;
    *out = &o->op;
    return ZR_OK;
}

static void pool_put_op(zr_engine_pool *p, zr_coll_op *op)
{
    if (op == NULL) {
        return;
    }
    pool_account(p); /* the op's workspace may have grown */
    /* op is the first member of its pool_op */
    pool_op *o = (pool_op *)(void *)op;
    ZR_ASSERT(o->busy);
    o->busy = 0;
}

static void pool_free(zr_comm *c, zr_engine_pool *p)
{
    if (p == NULL) {
        return;
    }
    for (int i = 0; i < p->nops; i++) {
        if (c != NULL) {
            (void)zr_coll_wait(c, &p->ops[i]->op); /* buffers go only after their exchanges */
        }
        zr_coll_op_free(&p->ops[i]->op);
        zr_free(p->ops[i]);
    }
    for (int i = 0; i < p->nbufs; i++) {
        zr_free(p->bufs[i].ptr);
    }
    zr_free(p->ops);
    zr_free(p->bufs);
    zr_free(p);
}

zr_plan zr_plan_preset(int stage, int hpz)
{
    zr_plan p = {stage, ZR_REPLICATED, ZR_REPLICATED, ZR_REPLICATED, 0};
    if (stage >= 1) {
        p.optim = ZR_SHARDED;
    }
    if (stage >= 2) {
        p.grads = ZR_SHARDED;
    }
    if (stage >= 3) {
        p.params = ZR_SHARDED;
        p.secondary = hpz != 0;
    }
    return p;
}

zr_engine_config zr_engine_config_default(void)
{
    zr_engine_config c;
    memset(&c, 0, sizeof c);
    c.stage = 3;
    c.param_wire.type = ZR_WIRE_BF16;
    c.grad_wire.type = ZR_WIRE_BF16;
    c.qwz_q = (zr_qparams){8, ZR_QUANT_DEFAULT_GROUP, ZR_QSYM};
    c.qgz_cfg.q = (zr_qparams){4, ZR_QUANT_DEFAULT_GROUP, ZR_QSYM};
    c.qgz_cfg.chunks = 1;
    c.overlap = 1;
    c.max_live = (size_t)1 << 30;
    c.prefetch_bucket = 50000000; /* DeepSpeed's stage3_prefetch_bucket_size default */
    c.reduce_bucket = 10000000;   /* one GPT-2-small block; DeepSpeed's default is 5e8 */
    c.beta1 = 0.9f;
    c.beta2 = 0.95f;
    c.eps = 1e-8f;
    c.weight_decay = 0.1f;
    c.grad_clip = 1.0f;
    return c;
}

static zr_status check_wire(const zr_wire *w, const char *what)
{
    if (w->type != ZR_WIRE_F32 && w->type != ZR_WIRE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s must be fp32 or bf16 (quantization is chosen by the qwZ/qgZ switches)", what);
    }
    return ZR_OK;
}

static zr_status check_config(const zr_engine_config *cfg)
{
    if (cfg->stage < 0 || cfg->stage > 3) {
        ZR_FAIL(ZR_ERR_INVALID, "zero_optimization.stage must be 0, 1, 2 or 3, got %d", cfg->stage);
    }
    ZR_CHECK(check_wire(&cfg->param_wire, "the parameter wire type"));
    ZR_CHECK(check_wire(&cfg->grad_wire, "the gradient wire type"));
    if (cfg->qwz && cfg->stage != 3) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zero_quantized_weights (qwZ) needs zero_optimization.stage 3, got stage %d",
                cfg->stage);
    }
    if (cfg->hpz && cfg->stage != 3) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zero_hpz_partition_size > 1 (hpZ) needs zero_optimization.stage 3, got stage %d",
                cfg->stage);
    }
    if (cfg->qgz && cfg->stage < 2) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zero_quantized_gradients (qgZ) needs zero_optimization.stage 2 or 3, got stage %d",
                cfg->stage);
    }
    if (cfg->reduce_bucket < 1) {
        ZR_FAIL(ZR_ERR_INVALID, "zero_optimization.reduce_bucket_size must be >= 1 element");
    }
    if (cfg->qwz) {
        ZR_CHECK(zr_qparams_check(&cfg->qwz_q));
    }
    if (cfg->qgz) {
        ZR_CHECK(zr_qparams_check(&cfg->qgz_cfg.q));
        if (cfg->qgz_cfg.chunks < 1) {
            ZR_FAIL(ZR_ERR_INVALID, "qgZ pipeline chunks must be >= 1, got %d",
                    cfg->qgz_cfg.chunks);
        }
    }
    if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f && cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f)) {
        ZR_FAIL(ZR_ERR_INVALID, "optimizer betas must be in [0, 1), got (%g, %g)", cfg->beta1,
                cfg->beta2);
    }
    if (!(cfg->eps > 0.0f) || !(cfg->weight_decay >= 0.0f)) {
        ZR_FAIL(ZR_ERR_INVALID, "optimizer eps must be > 0 and weight_decay >= 0, got %g and %g",
                cfg->eps, cfg->weight_decay);
    }
    return ZR_OK;
}

static int my_rank(const zr_engine *e)
{
    return e->comm->rank[ZR_GROUP_WORLD];
}

static int world(const zr_engine *e)
{
    return e->comm->size[ZR_GROUP_WORLD];
}

/* Offset of this rank's optimizer slice inside the optimizer buffers. */
static size_t optim_offset(const zr_engine *e, const zr_unit_state *s)
{
    return e->plan.optim == ZR_SHARDED ? 0 : (size_t)my_rank(e) * s->shard;
}

static zr_status unit_alloc(zr_engine *e, zr_unit_state *s, const zr_unit_spec *spec)
{
    int W = world(e);
    s->numel = spec->numel;
    s->padded = zr_zero_padded(spec->numel, W);
    s->shard = s->padded / (size_t)W;
    s->nranges = spec->nranges;
    s->ranges = spec->ranges;
    size_t optim_n = e->plan.optim == ZR_SHARDED ? s->shard : s->padded;
    ZR_ALLOC(s->master, optim_n);
    ZR_ALLOC(s->m, optim_n);
    ZR_ALLOC(s->v, optim_n);
    if (e->plan.params == ZR_REPLICATED) {
        if (e->plan.optim == ZR_REPLICATED) {
            s->full = s->master;
            s->full_is_master = 1;
        } else {
            ZR_ALLOC(s->full, s->padded);
        }
    }
    if (e->plan.grads == ZR_SHARDED) {
        ZR_ALLOC(s->grad_shard, s->shard);
    }
    if (e->plan.optim == ZR_SHARDED && e->plan.grads == ZR_REPLICATED) {
        ZR_ALLOC(s->grad_tmp, s->shard); /* stage 1: the step reads it */
    }
    if (e->plan.secondary) {
        int h = e->comm->size[ZR_GROUP_HPZ];
        s->sec_count = s->padded / (size_t)h;
        s->sec_type = e->cfg.param_wire.type == ZR_WIRE_F32 ? ZR_DTYPE_F32 : ZR_DTYPE_BF16;
        ZR_CHECK(zr_alloc_at(&s->secondary, s->sec_count * zr_dtype_size(s->sec_type), __FILE__,
                             __LINE__));
    }
    return ZR_OK;
}

zr_status zr_engine_init(zr_engine *e, zr_comm *comm, const zr_engine_config *cfg, int nunits,
                         const zr_unit_spec *units)
{
    memset(e, 0, sizeof *e);
    ZR_CHECK(zr_comm_agree(comm, check_config(cfg)));
    e->comm = comm;
    e->cfg = *cfg;
    e->plan = zr_plan_preset(cfg->stage, cfg->hpz);
    e->nunits = nunits;
    const char *safe = getenv("ZR_SAFE");
    e->safe = safe != NULL && strcmp(safe, "1") == 0;
    zr_status st = ZR_OK;
    if (nunits <= 0) {
        st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__, "a model needs at least one unit");
    }
    for (int u = 0; u < nunits && st == ZR_OK; u++) {
        size_t covered = 0;
        for (int i = 0; i < units[u].nranges; i++) {
            const zr_range *r = &units[u].ranges[i];
            if (r->offset != covered) {
                st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                                 "unit %d: ranges must cover the unit in order without gaps", u);
                break;
            }
            covered += r->numel;
        }
        if (st == ZR_OK && covered != units[u].numel) {
            st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                             "unit %d: ranges cover %zu of %zu elements", u, covered,
                             units[u].numel);
        }
    }
    if (st == ZR_OK) {
        st = zr_alloc_at((void **)&e->units, sizeof(zr_unit_state) * (size_t)nunits, __FILE__,
                         __LINE__);
    }
    if (st == ZR_OK) {
        st = zr_alloc_at((void **)&e->pool, sizeof *e->pool, __FILE__, __LINE__);
    }
    if (st == ZR_OK) {
        st = zr_alloc_at((void **)&e->fifo, sizeof(int) * (size_t)nunits, __FILE__, __LINE__);
    }
    for (int u = 0; u < nunits && st == ZR_OK; u++) {
        st = unit_alloc(e, &e->units[u], &units[u]);
    }
    /* an allocation can fail on one rank only */
    st = zr_comm_agree(comm, st);
    if (st != ZR_OK) {
        zr_engine_free(e);
    }
    return st;
}

void zr_engine_free(zr_engine *e)
{
    /* collectives still in flight finish (in pool_free) before any buffer goes */
    pool_free(e->comm, e->pool);
    zr_free(e->fifo);
    if (e->units != NULL) {
        for (int u = 0; u < e->nunits; u++) {
            zr_unit_state *s = &e->units[u];
            zr_qgz_feedback_free(&s->fb);
            if (e->plan.params == ZR_REPLICATED && !s->full_is_master) {
                zr_free(s->full); /* stage 3 gathers are pooled */
            }
            zr_free(s->secondary);
            if (e->plan.grads == ZR_REPLICATED) {
                zr_free(s->grad_full);
                zr_free(s->grad_tmp);
            }
            zr_free(s->grad_shard);
            zr_free(s->master);
            zr_free(s->m);
            zr_free(s->v);
        }
        zr_free(e->units);
    }
    memset(e, 0, sizeof *e);
}

size_t zr_engine_numel(const zr_engine *e, int u)
{
    return e->units[u].numel;
}

size_t zr_engine_padded(const zr_engine *e, int u)
{
    return e->units[u].padded;
}

size_t zr_engine_shard(const zr_engine *e, int u)
{
    return e->units[u].shard;
}

void zr_engine_invalidate_secondary(zr_engine *e)
{
    for (int u = 0; u < e->nunits; u++) {
        e->units[u].sec_valid = 0;
    }
}

/*
 * The ZeRO-3 baseline (bf16 on the wire, direct all-gather and reduce-scatter
 * over the world) would send 2*S bytes of unit u to every rank on another
 * node for each gather and each reduction zr performs; counting that beside
 * the real traffic shows what ZeRO++ keeps off the links.
 */
static void shadow_zero3(zr_engine *e, const zr_unit_state *s)
{
    int W = world(e), D = e->comm->ranks_per_node;
    e->zero3_inter += (uint64_t)2 * s->shard * (uint64_t)(W - D);
}

/* Wait on a collective and charge the blocked time to exposed communication. */
static zr_status wait_op(zr_engine *e, zr_coll_op *op)
{
    double t0 = zr_now();
    zr_status st = zr_coll_wait(e->comm, op);
    e->t_comm += zr_now() - t0;
    return st;
}

/* Exact all-gather of this rank's slices of buf (padded elements) in place. */
static zr_status gather_slices(zr_engine *e, zr_unit_state *s, float *buf, const zr_wire *wire)
{
    zr_coll_op *op;
    ZR_CHECK(pool_get_op(e->pool, &op));
    double t0 = zr_now();
    zr_status st = zr_allgather(e->comm, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, wire, ZR_DTYPE_F32,
                                buf + (size_t)my_rank(e) * s->shard, s->shard, buf, op);
    e->t_comm += zr_now() - t0;
    pool_put_op(e->pool, op);
    return st;
}

zr_status zr_engine_set_params(zr_engine *e, int u, const float *full)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    zr_unit_state *s = &e->units[u];
    size_t optim_n = e->plan.optim == ZR_SHARDED ? s->shard : s->padded;
    size_t first = e->plan.optim == ZR_SHARDED ? (size_t)my_rank(e) * s->shard : 0;
    memset(s->master, 0, optim_n * sizeof(float));
    memset(s->m, 0, optim_n * sizeof(float));
    memset(s->v, 0, optim_n * sizeof(float));
    if (first < s->numel) {
        size_t n = s->numel - first < optim_n ? s->numel - first : optim_n;
        memcpy(s->master, full + first, n * sizeof(float));
    }
    if (e->plan.params == ZR_REPLICATED && !s->full_is_master) {
        /* the working copy goes through the wire like every later refresh, so
           that all ranks hold the same bits from the start */
        memset(s->full, 0, s->padded * sizeof(float));
        memcpy(s->full + (size_t)my_rank(e) * s->shard, s->master, s->shard * sizeof(float));
        ZR_CHECK(gather_slices(e, s, s->full, &e->cfg.param_wire));
    }
    s->sec_valid = 0;
    return ZR_OK;
}

zr_status zr_engine_get_params(zr_engine *e, int u, float *full)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    zr_unit_state *s = &e->units[u];
    if (e->plan.optim == ZR_REPLICATED) {
        memcpy(full, s->master, s->numel * sizeof(float));
        return ZR_OK;
    }
    float *tmp;
    zr_coll_op *op;
    ZR_CHECK(pool_get(e->pool, s->padded, 0, &tmp));
    ZR_CHECK(pool_get_op(e->pool, &op));
    zr_wire exact = {ZR_WIRE_F32, {0, 0, ZR_QSYM}};
    zr_status st = zr_allgather(e->comm, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &exact, ZR_DTYPE_F32,
                                s->master, s->shard, tmp, op);
    if (st == ZR_OK) {
        memcpy(full, tmp, s->numel * sizeof(float));
    }
    pool_put_op(e->pool, op);
    pool_put(e->pool, tmp);
    return st;
}

zr_status zr_engine_optim_shard(zr_engine *e, int u, float **master, float **m, float **v)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    zr_unit_state *s = &e->units[u];
    size_t off = optim_offset(e, s);
    *master = s->master + off;
    *m = s->m + off;
    *v = s->v + off;
    return ZR_OK;
}

zr_status zr_engine_sync_from_shards(zr_engine *e)
{
    zr_wire exact = {ZR_WIRE_F32, {0, 0, ZR_QSYM}};
    for (int u = 0; u < e->nunits; u++) {
        zr_unit_state *s = &e->units[u];
        if (e->plan.optim == ZR_REPLICATED) {
            ZR_CHECK(gather_slices(e, s, s->master, &exact));
            ZR_CHECK(gather_slices(e, s, s->m, &exact));
            ZR_CHECK(gather_slices(e, s, s->v, &exact));
        } else if (e->plan.params == ZR_REPLICATED) {
            memcpy(s->full + (size_t)my_rank(e) * s->shard, s->master, s->shard * sizeof(float));
            ZR_CHECK(gather_slices(e, s, s->full, &e->cfg.param_wire));
        }
    }
    zr_engine_invalidate_secondary(e);
    return ZR_OK;
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
    if (s->full == NULL) {
        ZR_CHECK(pool_get(e->pool, s->padded, 0, &s->full)); /* the gather writes every element */
    }
    ZR_CHECK(pool_get_op(e->pool, &s->gop));
    zr_wire qwire = {ZR_WIRE_QUANT, e->cfg.qwz_q};
    const zr_wire *wire = e->cfg.qwz ? &qwire : &e->cfg.param_wire;
    if (use_secondary) {
        ZR_CHECK(zr_allgather_start(e->comm, ZR_GROUP_HPZ, ZR_KIND_HPZ, wire, s->sec_type,
                                    s->secondary, s->sec_count, s->full, s->gop));
    } else {
        ZR_CHECK(zr_allgather_start(e->comm, ZR_GROUP_WORLD,
                                    e->cfg.qwz ? ZR_KIND_QWZ : ZR_KIND_ALLGATHER, wire,
                                    ZR_DTYPE_F32, s->master, s->shard, s->full, s->gop));
    }
    pool_account(e->pool);
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
    ZR_CHECK(wait_op(e, s->gop));
    pool_put_op(e->pool, s->gop);
    s->gop = NULL;
    s->inflight = 0;
    s->gathered = 1;
    unprefetch(e, s);
    return ZR_OK;
}

zr_status zr_engine_fetch(zr_engine *e, int u, zr_phase phase, const float **params)
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
        ZR_CHECK(zr_hpz_cut(e->comm, s->full, s->sec_count, s->sec_type, s->secondary));
        s->sec_valid = 1;
    }
    pool_put(e->pool, s->full);
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
static zr_status finish_oldest(zr_engine *e)
{
    ZR_ASSERT(e->nreducing > 0);
    zr_unit_state *s = &e->units[e->fifo[e->fifo_head]];
    e->fifo_head = (e->fifo_head + 1) % e->nunits;
    e->nreducing--;
    e->reducing -= s->padded;
    s->grad_inflight = 0;
    zr_status st = wait_op(e, s->rop);
    pool_put_op(e->pool, s->rop);
    s->rop = NULL;
    ZR_CHECK(st);
    if (e->plan.grads == ZR_SHARDED) {
        for (size_t i = 0; i < s->shard; i++) {
            s->grad_shard[i] += s->grad_tmp[i];
        }
        pool_put(e->pool, s->grad_tmp);
        pool_put(e->pool, s->grad_full);
        s->grad_tmp = NULL;
        s->grad_full = NULL;
    }
    return ZR_OK;
}

/* Complete unit s's reduction (and every older one: they finish in start order). */
static zr_status finish_grad(zr_engine *e, zr_unit_state *s)
{
    while (s->grad_inflight) {
        ZR_CHECK(finish_oldest(e));
    }
    return ZR_OK;
}

/*
 * Make room for a reduction of s: finish the oldest ones while the elements
 * in flight would exceed reduce_bucket_size (one is always allowed), then
 * take an op and record s as the newest in flight. The caller starts it.
 */
static zr_status reduce_begin(zr_engine *e, zr_unit_state *s)
{
    while (e->nreducing > 0 && e->reducing + s->padded > e->cfg.reduce_bucket) {
        ZR_CHECK(finish_oldest(e));
    }
    ZR_CHECK(pool_get_op(e->pool, &s->rop));
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
        e->t_optim = 0.0;
        e->live_peak = e->live;
        e->traffic_begin = zr_comm_traffic_get(e->comm);
        e->zero3_inter = 0;
    }
    e->micro++;
    return ZR_OK;
}

zr_status zr_engine_grads(zr_engine *e, int u, float **grads)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    zr_unit_state *s = &e->units[u];
    ZR_CHECK(finish_grad(e, s));
    if (s->grad_full == NULL) {
        if (e->plan.grads == ZR_SHARDED) {
            ZR_CHECK(pool_get(e->pool, s->padded, 1, &s->grad_full));
        } else {
            ZR_CHECK(
                zr_alloc_at((void **)&s->grad_full, s->padded * sizeof(float), __FILE__, __LINE__));
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
    ZR_CHECK(reduce_begin(e, s));
    ZR_CHECK(pool_get(e->pool, s->shard, 0, &s->grad_tmp)); /* the reduction writes it whole */
    if (e->cfg.qgz) {
        ZR_CHECK(zr_qgz_start(e->comm, &e->cfg.qgz_cfg, ZR_DTYPE_F32, s->grad_full, s->shard,
                              s->grad_tmp, e->cfg.qgz_cfg.error_feedback ? &s->fb : NULL, s->rop));
    } else {
        ZR_CHECK(zr_reduce_scatter_start(e->comm, ZR_GROUP_WORLD, &e->cfg.grad_wire, s->grad_full,
                                         s->shard, s->grad_tmp, s->rop));
    }
    pool_account(e->pool);
    shadow_zero3(e, s);
    if (!e->cfg.overlap) {
        ZR_CHECK(finish_grad(e, s));
    }
    return ZR_OK;
}

/* ---- the step ------------------------------------------------------------------ */

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
            ZR_CHECK(
                zr_alloc_at((void **)&s->grad_full, s->padded * sizeof(float), __FILE__, __LINE__));
        }
        ZR_CHECK(reduce_begin(e, s));
        if (e->plan.optim == ZR_SHARDED) {
            ZR_CHECK(zr_reduce_scatter_start(e->comm, ZR_GROUP_WORLD, &e->cfg.grad_wire,
                                             s->grad_full, s->shard, s->grad_tmp, s->rop));
        } else {
            ZR_CHECK(zr_allreduce_start(e->comm, ZR_GROUP_WORLD, &e->cfg.grad_wire, s->grad_full,
                                        s->padded, s->rop));
        }
        pool_account(e->pool);
    }
    while (e->nreducing > 0) {
        ZR_CHECK(finish_oldest(e));
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
    return s->grad_full + (size_t)my_rank(e) * s->shard;
}

static void adamw_unit(zr_engine *e, zr_unit_state *s, float lr, float grad_scale)
{
    zr_adamw h = {lr, e->cfg.beta1, e->cfg.beta2, e->cfg.eps, e->cfg.weight_decay};
    /* the element range this rank updates, in unit coordinates */
    size_t lo, hi;
    const float *g;
    float *master, *m, *v;
    if (e->plan.optim == ZR_SHARDED) {
        lo = (size_t)my_rank(e) * s->shard;
        hi = lo + s->shard;
        g = grad_slice(e, s) - lo;
        master = s->master - lo;
        m = s->m - lo;
        v = s->v - lo;
    } else {
        lo = 0;
        hi = s->padded;
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
        if (a < b) {
            zr_adamw_update(&h, lr, e->step, grad_scale, s->ranges[i].decay, master + a, g + a,
                            m + a, v + a, b - a);
        }
    }
}

zr_status zr_engine_step(zr_engine *e, float lr, zr_step_stats *stats)
{
    if (e->micro == 0) {
        ZR_FAIL(ZR_ERR_INVALID, "zr_engine_step called before any micro-batch");
    }
    ZR_CHECK(reduce_replicated_grads(e));

    /* global norm of the averaged gradient: each rank sums its slice */
    double sq = 0.0;
    for (int u = 0; u < e->nunits; u++) {
        sq += zr_sumsq(grad_slice(e, &e->units[u]), e->units[u].shard);
    }
    ZR_CHECK(zr_comm_allreduce_sum_f64(e->comm, ZR_GROUP_WORLD, &sq, 1));
    double inv_micro = 1.0 / (double)e->micro;
    double norm = sqrt(sq) * inv_micro;
    int finite = isfinite(norm);
    stats->grad_norm = norm;
    stats->skipped = !finite;

    double t0 = zr_now();
    if (finite) {
        e->step++;
        float scale = zr_clip_scale(norm, e->cfg.grad_clip) * (float)inv_micro;
        for (int u = 0; u < e->nunits; u++) {
            adamw_unit(e, &e->units[u], lr, scale);
        }
    } else if (my_rank(e) == 0) {
        ZR_WARN("non-finite gradient norm (%g) at step %d: skipping the optimizer step on every "
                "rank",
                norm, e->step + 1);
    }
    e->t_optim += zr_now() - t0;

    /* refresh the working parameters and clear the gradients */
    for (int u = 0; u < e->nunits; u++) {
        zr_unit_state *s = &e->units[u];
        if (finite && e->plan.params == ZR_REPLICATED && !s->full_is_master) {
            memcpy(s->full + (size_t)my_rank(e) * s->shard, s->master, s->shard * sizeof(float));
            ZR_CHECK(gather_slices(e, s, s->full, &e->cfg.param_wire));
        }
        if (s->grad_shard != NULL) {
            memset(s->grad_shard, 0, s->shard * sizeof(float));
        }
        if (e->plan.grads == ZR_REPLICATED && s->grad_full != NULL) {
            memset(s->grad_full, 0, s->padded * sizeof(float));
        }
    }
    if (finite) {
        zr_engine_invalidate_secondary(e);
    }
    e->micro = 0;

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
    return ZR_OK;
}

zr_memory_plan zr_engine_plan_memory(const zr_engine_config *cfg, const zr_comm *comm, int nunits,
                                     const zr_unit_spec *units, int held, int ahead)
{
    zr_plan plan = zr_plan_preset(cfg->stage, cfg->hpz);
    size_t W = (size_t)comm->size[ZR_GROUP_WORLD], h = (size_t)comm->size[ZR_GROUP_HPZ];
    double state = 0, total = 0, big = 0;
    for (int u = 0; u < nunits; u++) {
        size_t padded = zr_round_up(units[u].numel == 0 ? 1 : units[u].numel, W * ZR_ZERO_PAD);
        double P = (double)padded, S = P / (double)W;
        state += 3 * 4 * (plan.optim == ZR_SHARDED ? S : P); /* master, m, v */
        if (plan.params == ZR_REPLICATED && plan.optim == ZR_SHARDED) {
            state += 4 * P; /* working copy (stages 1-2) */
        }
        state += plan.grads == ZR_SHARDED ? 4 * S : 4 * P;
        if (plan.grads == ZR_REPLICATED && plan.optim == ZR_SHARDED) {
            state += 4 * S; /* stage 1: the reduce-scatter's output */
        }
        if (plan.secondary) {
            state += P / (double)h * (cfg->param_wire.type == ZR_WIRE_F32 ? 4 : 2);
        }
        total += P;
        big = P > big ? P : big;
    }
    /* Elements the pool may serve at once, each slot counted at the largest
       unit: gathers (held + what prefetch may add), reductions in flight
       (up to reduce_bucket, or one unit) and gradients being computed. */
    double held_el = (double)held * big;
    double gathered = 0, inflight, computing = 0;
    if (plan.params == ZR_SHARDED) {
        double pre = cfg->overlap ? fmin((double)cfg->prefetch_bucket, (double)cfg->max_live) : 0;
        gathered = fmin(total, held_el + fmin(pre, (double)ahead * big));
    }
    inflight = fmin(total, fmax((double)cfg->reduce_bucket, big) + big);
    if (plan.grads == ZR_SHARDED) {
        computing = fmin(total, held_el);
    }
    /* bytes per element: a gathered buffer 4 + the gather's workspace (bf16:
       2 + 2/W, qwZ less, fp32 none) <= 8; a reduction in flight: the full
       gradient 4 + staging 4/W + the workspace (bf16 4, fp32 4/W + 4) <= 12
       at stages 2-3, the workspace alone (<= 8) at stages 0-1, whose gradients
       are model state; and a blocking gather for the stage 0-2 refresh */
    double pool = 8 * gathered + 4 * computing + (plan.grads == ZR_SHARDED ? 12 : 8) * inflight +
                  4 * big + 4 * big;
    zr_memory_plan out = {(size_t)state, (size_t)pool};
    return out;
}

zr_memory zr_engine_memory(const zr_engine *e)
{
    zr_memory mem;
    memset(&mem, 0, sizeof mem);
    for (int u = 0; u < e->nunits; u++) {
        const zr_unit_state *s = &e->units[u];
        size_t optim_n = e->plan.optim == ZR_SHARDED ? s->shard : s->padded;
        mem.optim += 3 * optim_n * sizeof(float);
        if (e->plan.params == ZR_REPLICATED) {
            if (!s->full_is_master) {
                mem.params += s->padded * sizeof(float);
            }
        } else if (s->full != NULL) {
            mem.gathered += s->padded * sizeof(float);
        }
        if (e->plan.grads == ZR_SHARDED) {
            mem.grads += s->shard * sizeof(float);
        } else {
            mem.grads += s->padded * sizeof(float);
            if (e->plan.optim == ZR_SHARDED) {
                mem.grads += s->shard * sizeof(float); /* stage 1: the reduce-scatter's output */
            }
        }
        if (e->plan.secondary) {
            mem.secondary += s->sec_count * zr_dtype_size(s->sec_type);
        }
    }
    if (e->pool != NULL) {
        mem.pool = e->pool->now;
        mem.pool_peak = e->pool->peak;
    }
    return mem;
}
