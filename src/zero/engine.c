/*
 * engine.c - the ZeRO engine: one code path for stages 0-3 and ZeRO++,
 * driven by the sharding plan (zr_zero_plan) rather than by per-stage branches
 * wherever the plan can say it. This file holds the plan, the configuration,
 * the engine's set-up and tear-down (real or dry), parameters in and out,
 * and its memory accounting and prediction; zero_impl.h lists the others.
 *
 * Life of a unit's state (W ranks, padded unit of P = W*S elements; "work"
 * is the working type, zr_engine_config.work_type, fp32 or bf16):
 *
 *   optimizer   master, m, v: S floats each when sharded, P when replicated
 *   params      replicated: `full` (P elements) lives for the whole run; with
 *               a replicated optimizer (stage 0) it is the fp32 master
 *               itself, else (stages 1-2) a working copy in the work type,
 *               gathered from the master shards after every step.
 *               sharded (stage 3): `full` (P, work type) exists only between
 *               a gather and its release; the master shard is the working
 *               shard.
 *   secondary   hpZ: P/h elements (bf16 unless the wire and the work type are
 *               fp32), cut at the first release after a primary gather,
 *               dropped at every step
 *   grads       replicated: `grad_full` (P floats) accumulates all
 *               micro-batches; fp32 whatever the work type, since a bf16 sum
 *               over micro-batches would drop what each adds below its ulp.
 *               sharded: `grad_full` (P, work type) lives from zr_engine_grads
 *               until its reduce-scatter (or qgZ) completes; the fp32 result
 *               lands in a staging buffer `grad_tmp` (S) and is added into
 *               `grad_shard` (S floats), which accumulates the micro-batches:
 *               one float per shard element stays between reductions.
 *
 * Transient memory comes from one pool per engine (pool.c). What is in use
 * at once is bounded by the budgets: gathers by stage3_max_live_parameters /
 * stage3_prefetch_bucket_size (plus what the caller holds), reductions in
 * flight by reduce_bucket_size (elements; the oldest is finished before a
 * new one would exceed it, and one is always allowed).
 *
 * A dry engine holds a one-element token in place of every payload above,
 * so the same code (which tests buffers for NULL) runs, and its sizes and
 * accounting are the real engine's.
 *
 * Every buffer above is the engine's memory (buffers.c): host memory, or the
 * GPU of a device transport, with the same layout and life cycle; this file
 * and the others touch payloads only through the engine's buffer table
 * (e->bufs, zero_impl.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "zero_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

zr_zero_plan zr_zero_plan_preset(int stage, int hpz)
{
    zr_zero_plan p = {stage, ZR_REPLICATED, ZR_REPLICATED, ZR_REPLICATED, 0};
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
    c.qwz_q = (zr_quant_params){8, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM};
    c.qgz_cfg.q = (zr_quant_params){4, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM};
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
    c.work_type = ZR_DTYPE_F32;
    return c;
}

zr_dtype zr_engine_param_type(const zr_engine_config *cfg)
{
    return cfg->stage == 0 ? ZR_DTYPE_F32 : cfg->work_type; /* stage 0 computes on the master */
}

zr_dtype zr_engine_grad_type(const zr_engine_config *cfg)
{
    return cfg->stage >= 2 ? cfg->work_type : ZR_DTYPE_F32; /* stages 0-1 accumulate in place */
}

/* The hpZ secondary's type: bf16, unless the wire and the gathered unit are both fp32. */
static zr_dtype secondary_type(const zr_engine_config *cfg)
{
    int f32 = cfg->param_wire.type == ZR_WIRE_F32 && cfg->work_type == ZR_DTYPE_F32;
    return f32 ? ZR_DTYPE_F32 : ZR_DTYPE_BF16;
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
    if (cfg->work_type != ZR_DTYPE_F32 && cfg->work_type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "the engine's working type must be fp32 or bf16, got %d",
                (int)cfg->work_type);
    }
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
        ZR_CHECK(zr_quant_params_check(&cfg->qwz_q));
    }
    if (cfg->qgz) {
        ZR_CHECK(zr_quant_params_check(&cfg->qgz_cfg.q));
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

/* Offset of this rank's optimizer slice inside the optimizer buffers. */
static size_t optim_offset(const zr_engine *e, const zr_unit_state *s)
{
    return e->plan.optim == ZR_SHARDED ? 0 : (size_t)zr_engine_rank(e) * s->shard;
}

static zr_status unit_alloc(zr_engine *e, zr_unit_state *s, const zr_unit_spec *spec)
{
    int W = e->comm->size[ZR_GROUP_WORLD];
    s->numel = spec->numel;
    s->padded = zr_zero_padded(spec->numel, W);
    s->shard = s->padded / (size_t)W;
    s->nranges = spec->nranges;
    s->ranges = spec->ranges;
    size_t optim_n = e->plan.optim == ZR_SHARDED ? s->shard : s->padded;
    ZR_ENGINE_ALLOC(e, s->master, optim_n);
    ZR_ENGINE_ALLOC(e, s->m, optim_n);
    ZR_ENGINE_ALLOC(e, s->v, optim_n);
    if (e->plan.params == ZR_REPLICATED) {
        if (e->plan.optim == ZR_REPLICATED) {
            s->full = s->master;
            s->full_is_master = 1;
        } else {
            unsigned char *full;
            ZR_ENGINE_ALLOC(e, full, s->padded * zr_dtype_size(zr_engine_full_type(e)));
            s->full = full;
        }
    }
    if (e->plan.grads == ZR_SHARDED) {
        ZR_ENGINE_ALLOC(e, s->grad_shard, s->shard);
    }
    if (e->plan.optim == ZR_SHARDED && e->plan.grads == ZR_REPLICATED) {
        ZR_ENGINE_ALLOC(e, s->grad_tmp, s->shard); /* stage 1: the step reads it */
    }
    if (e->plan.secondary) {
        int h = e->comm->size[ZR_GROUP_HPZ];
        s->sec_count = s->padded / (size_t)h;
        s->sec_type = secondary_type(&e->cfg);
        unsigned char *sec;
        ZR_ENGINE_ALLOC(e, sec, s->sec_count * zr_dtype_size(s->sec_type));
        s->secondary = sec;
    }
    return ZR_OK;
}

/* The units' ranges must cover each unit in order. */
static zr_status check_units(int nunits, const zr_unit_spec *units)
{
    if (nunits <= 0) {
        ZR_FAIL(ZR_ERR_INVALID, "a model needs at least one unit");
    }
    for (int u = 0; u < nunits; u++) {
        size_t covered = 0;
        for (int i = 0; i < units[u].nranges; i++) {
            const zr_range *r = &units[u].ranges[i];
            if (r->offset != covered) {
                ZR_FAIL(ZR_ERR_INVALID, "unit %d: ranges must cover the unit in order without gaps",
                        u);
            }
            covered += r->numel;
        }
        if (covered != units[u].numel) {
            ZR_FAIL(ZR_ERR_INVALID, "unit %d: ranges cover %zu of %zu elements", u, covered,
                    units[u].numel);
        }
    }
    return ZR_OK;
}

/* Everything but the agreements of a real engine; dry: obs.event != NULL. */
static zr_status setup(zr_engine *e, zr_comm *comm, const zr_engine_config *cfg, int nunits,
                       const zr_unit_spec *units, zr_engine_observer obs)
{
    e->comm = comm;
    e->cfg = *cfg;
    e->plan = zr_zero_plan_preset(cfg->stage, cfg->hpz);
    e->nunits = nunits;
    e->dry = obs;
    const char *safe = getenv("ZR_SAFE");
    e->safe = !zr_engine_is_dry(e) && safe != NULL && strcmp(safe, "1") == 0;
    ZR_CHECK(check_units(nunits, units));
    ZR_CHECK(zr_engine_place(e));
    ZR_ALLOC(e->units, (size_t)nunits);
    ZR_CHECK(zr_engine_pool_init(e));
    ZR_ALLOC(e->fifo, (size_t)nunits);
    for (int u = 0; u < nunits; u++) {
        ZR_CHECK(unit_alloc(e, &e->units[u], &units[u]));
    }
    return ZR_OK;
}

zr_status zr_engine_init(zr_engine *e, zr_comm *comm, const zr_engine_config *cfg, int nunits,
                         const zr_unit_spec *units)
{
    memset(e, 0, sizeof *e);
    ZR_CHECK(zr_comm_agree(comm, check_config(cfg)));
    zr_engine_observer real = {NULL, NULL};
    zr_status st = setup(e, comm, cfg, nunits, units, real);
    /* an allocation can fail on one rank only */
    st = zr_comm_agree(comm, st);
    if (st != ZR_OK) {
        zr_engine_free(e);
    }
    return st;
}

zr_status zr_engine_init_dry(zr_engine *e, zr_comm *layout, const zr_engine_config *cfg, int nunits,
                             const zr_unit_spec *units, zr_engine_observer obs)
{
    memset(e, 0, sizeof *e);
    ZR_ASSERT(obs.event != NULL);
    ZR_CHECK(check_config(cfg));
    zr_status st = setup(e, layout, cfg, nunits, units, obs);
    if (st != ZR_OK) {
        zr_engine_free(e);
    }
    return st;
}

void zr_engine_free(zr_engine *e)
{
    /* collectives still in flight finish (in zr_engine_pool_free) before any buffer goes */
    zr_engine_pool_free(e);
    zr_free(e->fifo);
    if (e->units != NULL) {
        for (int u = 0; u < e->nunits; u++) {
            zr_unit_state *s = &e->units[u];
            zr_qgz_feedback_free(&s->fb);
            if (e->plan.params == ZR_REPLICATED && !s->full_is_master) {
                zr_engine_buf_free(e, s->full); /* stage 3 gathers are pooled */
            }
            zr_engine_buf_free(e, s->secondary);
            if (e->plan.grads == ZR_REPLICATED) {
                zr_engine_buf_free(e, s->grad_full);
                zr_engine_buf_free(e, s->grad_tmp);
            }
            zr_engine_buf_free(e, s->grad_shard);
            zr_engine_buf_free(e, s->master);
            zr_engine_buf_free(e, s->m);
            zr_engine_buf_free(e, s->v);
        }
        zr_free(e->units);
    }
    zr_engine_unplace(e);
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

zr_status zr_engine_refresh_full(zr_engine *e, zr_unit_state *s)
{
    /* every rank's copy through the wire, its own slice too, so that all hold the same bits */
    return zr_engine_gather_slices(e, s, s->master, s->full, zr_engine_full_type(e),
                                   &e->cfg.param_wire);
}

zr_status zr_engine_set_params(zr_engine *e, int u, const float *full)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    zr_unit_state *s = &e->units[u];
    size_t optim_n = e->plan.optim == ZR_SHARDED ? s->shard : s->padded;
    size_t first = e->plan.optim == ZR_SHARDED ? (size_t)zr_engine_rank(e) * s->shard : 0;
    s->sec_valid = 0;
    if (zr_engine_is_dry(e)) {
        /* the refresh of a replicated working copy is all that shows */
        if (e->plan.params == ZR_REPLICATED && !s->full_is_master) {
            ZR_CHECK(zr_engine_refresh_full(e, s));
        }
        return ZR_OK;
    }
    ZR_CHECK(zr_engine_buf_zero(e, s->master, optim_n * sizeof(float)));
    ZR_CHECK(zr_engine_buf_zero(e, s->m, optim_n * sizeof(float)));
    ZR_CHECK(zr_engine_buf_zero(e, s->v, optim_n * sizeof(float)));
    if (first < s->numel) {
        size_t n = s->numel - first < optim_n ? s->numel - first : optim_n;
        ZR_CHECK(zr_engine_buf_copy(e, s->master, full + first, n * sizeof(float)));
    }
    if (e->plan.params == ZR_REPLICATED && !s->full_is_master) {
        ZR_CHECK(zr_engine_refresh_full(e, s));
    }
    /* full is the caller's: it may go as soon as this returns */
    return zr_engine_buf_sync(e);
}

static zr_status refuse_dry(const zr_engine *e, const char *what)
{
    if (zr_engine_is_dry(e)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: a dry engine holds no parameters", what);
    }
    return ZR_OK;
}

zr_status zr_engine_get_params(zr_engine *e, int u, float *full)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    ZR_CHECK(refuse_dry(e, "zr_engine_get_params"));
    zr_unit_state *s = &e->units[u];
    if (e->plan.optim == ZR_REPLICATED) {
        ZR_CHECK(zr_engine_buf_copy(e, full, s->master, s->numel * sizeof(float)));
        return zr_engine_buf_sync(e);
    }
    void *tmp;
    zr_coll_op *op;
    ZR_CHECK(zr_engine_pool_get(e, s->padded * sizeof(float), 0, &tmp));
    ZR_CHECK(zr_engine_pool_get_op(e->pool, &op));
    zr_wire exact = {ZR_WIRE_F32, {0, 0, ZR_QUANT_SYM}};
    zr_status st;
    ZR_CHECK_GOTO(zr_allgather(e->comm, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &exact, ZR_DTYPE_F32,
                               s->master, s->shard, ZR_DTYPE_F32, tmp, op),
                  st, done);
    ZR_CHECK_GOTO(zr_engine_buf_copy(e, full, tmp, s->numel * sizeof(float)), st, done);
    st = zr_engine_buf_sync(e);
done:
    zr_engine_pool_put_op(e->pool, op);
    zr_engine_pool_put(e->pool, tmp);
    return st;
}

/* Where element offset of this rank's optimizer slice of s lives in array which. */
static zr_status optim_at(zr_engine *e, int u, zr_optim_array which, size_t offset, size_t count,
                          float **at)
{
    ZR_ASSERT(u >= 0 && u < e->nunits);
    ZR_CHECK(refuse_dry(e, "the optimizer state"));
    zr_unit_state *s = &e->units[u];
    if (offset > s->shard || count > s->shard - offset) {
        ZR_FAIL(ZR_ERR_INVALID,
                "optimizer slice of unit %d: elements [%zu, +%zu) of a shard of %zu", u, offset,
                count, s->shard);
    }
    float *base = which == ZR_OPTIM_MASTER ? s->master : which == ZR_OPTIM_M ? s->m : s->v;
    *at = base + optim_offset(e, s) + offset;
    return ZR_OK;
}

zr_status zr_engine_optim_read(zr_engine *e, int u, zr_optim_array which, size_t offset,
                               size_t count, float *host)
{
    float *at = NULL;
    ZR_CHECK(optim_at(e, u, which, offset, count, &at));
    ZR_CHECK(zr_engine_buf_copy(e, host, at, count * sizeof(float)));
    return zr_engine_buf_sync(e);
}

zr_status zr_engine_optim_write(zr_engine *e, int u, zr_optim_array which, size_t offset,
                                size_t count, const float *host)
{
    float *at = NULL;
    ZR_CHECK(optim_at(e, u, which, offset, count, &at));
    ZR_CHECK(zr_engine_buf_copy(e, at, host, count * sizeof(float)));
    return zr_engine_buf_sync(e); /* host is the caller's again when this returns */
}

size_t zr_engine_feedback_count(const zr_engine *e, int u, int hop)
{
    ZR_ASSERT(u >= 0 && u < e->nunits && (hop == 0 || hop == 1));
    const zr_qgz_feedback *fb = &e->units[u].fb;
    if (hop == 0) {
        return fb->intra != NULL ? fb->n_intra : 0;
    }
    return fb->inter != NULL ? fb->n_inter : 0;
}

/* Elements [offset, offset + count) of hop's residuals of unit u, which must hold them. */
static zr_status feedback_at(zr_engine *e, int u, int hop, size_t offset, size_t count, float **at)
{
    ZR_CHECK(refuse_dry(e, "the qgZ residuals"));
    size_t n = zr_engine_feedback_count(e, u, hop);
    if (offset > n || count > n - offset) {
        ZR_FAIL(ZR_ERR_INVALID, "qgZ residuals of unit %d (hop %d): elements [%zu, +%zu) of %zu", u,
                hop, offset, count, n);
    }
    zr_qgz_feedback *fb = &e->units[u].fb;
    *at = (hop == 0 ? fb->intra : fb->inter) + offset;
    return ZR_OK;
}

zr_status zr_engine_feedback_read(zr_engine *e, int u, int hop, size_t offset, size_t count,
                                  float *host)
{
    float *at = NULL;
    ZR_CHECK(feedback_at(e, u, hop, offset, count, &at));
    ZR_CHECK(zr_engine_buf_copy(e, host, at, count * sizeof(float)));
    return zr_engine_buf_sync(e);
}

zr_status zr_engine_feedback_write(zr_engine *e, int u, int hop, size_t total, size_t offset,
                                   size_t count, const float *host)
{
    ZR_CHECK(refuse_dry(e, "the qgZ residuals"));
    zr_qgz_feedback *fb = &e->units[u].fb;
    float **buf = hop == 0 ? &fb->intra : &fb->inter;
    size_t *n = hop == 0 ? &fb->n_intra : &fb->n_inter;
    if (*buf == NULL || *n != total) {
        /* where qgZ keeps them (reduce_scatter_qgz.c): the data plane's device, or the host */
        const zr_device *d = zr_comm_device(e->comm, NULL);
        zr_device dev = d != NULL ? *d : zr_device_cpu();
        if (fb->intra == NULL && fb->inter == NULL) {
            fb->dev = dev;
        }
        ZR_ASSERT(zr_device_same(&dev, &fb->dev));
        zr_device_free(&fb->dev, *buf);
        *buf = NULL;
        *n = 0;
        ZR_CHECK(zr_device_alloc_at(&fb->dev, (void **)buf, (total > 0 ? total : 1) * sizeof(float),
                                    __FILE__, __LINE__));
        *n = total;
    }
    float *at = NULL;
    ZR_CHECK(feedback_at(e, u, hop, offset, count, &at));
    ZR_CHECK(zr_engine_buf_copy(e, at, host, count * sizeof(float)));
    return zr_engine_buf_sync(e); /* host is the caller's again when this returns */
}

zr_status zr_engine_sync_from_shards(zr_engine *e)
{
    ZR_CHECK(refuse_dry(e, "zr_engine_sync_from_shards"));
    zr_wire exact = {ZR_WIRE_F32, {0, 0, ZR_QUANT_SYM}};
    for (int u = 0; u < e->nunits; u++) {
        zr_unit_state *s = &e->units[u];
        if (e->plan.optim == ZR_REPLICATED) {
            /* in place: this rank's slices were written (zr_engine_optim_write) */
            float *arrays[3] = {s->master, s->m, s->v};
            for (int k = 0; k < 3; k++) {
                const float *mine = arrays[k] + (size_t)zr_engine_rank(e) * s->shard;
                ZR_CHECK(zr_engine_gather_slices(e, s, mine, arrays[k], ZR_DTYPE_F32, &exact));
            }
        } else if (e->plan.params == ZR_REPLICATED) {
            ZR_CHECK(zr_engine_refresh_full(e, s));
        }
    }
    zr_engine_invalidate_secondary(e);
    return ZR_OK;
}

/* Model-state bytes of a unit of P padded elements (S = P/W) under cfg. */
static double unit_state_bytes(const zr_engine_config *cfg, const zr_zero_plan *plan, double P,
                               double W, double h)
{
    double S = P / W, state = 3 * 4 * (plan->optim == ZR_SHARDED ? S : P); /* master, m, v */
    if (plan->params == ZR_REPLICATED && plan->optim == ZR_SHARDED) {
        state += (double)zr_dtype_size(zr_engine_param_type(cfg)) * P; /* working copy (1-2) */
    }
    state += plan->grads == ZR_SHARDED ? 4 * S : 4 * P; /* fp32: the shard, or stage 0-1's */
    if (plan->grads == ZR_REPLICATED && plan->optim == ZR_SHARDED) {
        state += 4 * S; /* stage 1: the reduce-scatter's output */
    }
    if (plan->secondary) {
        state += P / h * (double)zr_dtype_size(secondary_type(cfg));
    }
    return state;
}

/*
 * Bytes per element the pool may hold for: a gathered unit (stage 3), its
 * buffer and the gather's workspace; a reduction in flight, with the
 * gradient buffer and staging at stages 2-3 or the workspace alone at stages
 * 0-1 (whose gradients are model state). fp32 working buffers: a gathered
 * buffer 4 + the gather's workspace (a bf16 wire's receive buffer 2, qwZ's
 * blocks less, fp32 none) <= 8; a reduction 4 + staging 4/W + the workspace
 * (a bf16 wire's receive and send buffers 2 + 2, fp32's receive buffer 4,
 * qgZ's blocks less) <= 12, and <= 8 at stages 0-1. bf16: an exact bf16
 * gather lands in the buffer itself (2), an fp32 or quantized one needs up
 * to 4 more; a reduction 2 + 4/W + a bf16 wire's receive buffer 2 <= 8, or
 * an fp32 wire's receive and widened send buffers 4 + 4 (<= 14).
 */
static void pool_rates(const zr_engine_config *cfg, double *gathered, double *inflight)
{
    int bf16_wire = cfg->param_wire.type == ZR_WIRE_BF16 && !cfg->qwz;
    if (zr_engine_param_type(cfg) == ZR_DTYPE_F32) {
        *gathered = 8;
    } else {
        *gathered = bf16_wire ? 2 : 6;
    }
    if (cfg->stage < 2) {
        *inflight = 8;
    } else if (zr_engine_grad_type(cfg) == ZR_DTYPE_F32) {
        *inflight = 12;
    } else {
        *inflight = cfg->grad_wire.type == ZR_WIRE_BF16 || cfg->qgz ? 8 : 14;
    }
}

/* Padded elements of the k largest of the units (k at most 8). */
static double top_units(const zr_unit_spec *units, int nunits, size_t W, int k)
{
    double top[8] = {0};
    k = k < 1 ? 1 : k > 8 ? 8 : k;
    for (int u = 0; u < nunits; u++) {
        double p = (double)zr_round_up(units[u].numel == 0 ? 1 : units[u].numel, W * ZR_ZERO_PAD);
        for (int i = 0; i < k; i++) {
            if (p > top[i]) {
                double t = top[i];
                top[i] = p;
                p = t;
            }
        }
    }
    double sum = 0;
    for (int i = 0; i < k; i++) {
        sum += top[i];
    }
    return sum;
}

zr_memory_plan zr_engine_plan_memory(const zr_engine_config *cfg, const zr_comm *comm, int nunits,
                                     const zr_unit_spec *units, int held, int ahead)
{
    zr_zero_plan plan = zr_zero_plan_preset(cfg->stage, cfg->hpz);
    size_t W = (size_t)comm->size[ZR_GROUP_WORLD], h = (size_t)comm->size[ZR_GROUP_HPZ];
    double state = 0, total = 0, big = 0;
    for (int u = 0; u < nunits; u++) {
        size_t padded = zr_round_up(units[u].numel == 0 ? 1 : units[u].numel, W * ZR_ZERO_PAD);
        state += unit_state_bytes(cfg, &plan, (double)padded, (double)W, (double)h);
        total += (double)padded;
        big = (double)padded > big ? (double)padded : big;
    }
    /* Elements the pool may serve at once, each slot counted at one of the
       largest units (distinct units: k slots hold at most the k largest,
       which a model with one large unit, an embedding of a large vocabulary,
       is far below k times its largest): gathers (held + what prefetch may
       add), reductions in flight (up to reduce_bucket, or one unit, and the
       one being added) and gradients being computed. */
    double held_el = top_units(units, nunits, W, held);
    double gathered = 0, inflight, computing = 0;
    if (plan.params == ZR_SHARDED) {
        double pre = cfg->overlap ? fmin((double)cfg->prefetch_bucket, (double)cfg->max_live) : 0;
        gathered =
            fmin(total, held_el + fmin(pre, top_units(units, nunits, W, held + ahead) - held_el));
    }
    inflight =
        fmin(total, big + fmax((double)cfg->reduce_bucket, top_units(units, nunits, W, 2) - big));
    if (plan.grads == ZR_SHARDED) {
        computing = fmin(total, held_el);
    }
    double rate_gathered, rate_inflight;
    pool_rates(cfg, &rate_gathered, &rate_inflight);
    double grad_bytes = (double)zr_dtype_size(zr_engine_grad_type(cfg));
    /* and a blocking gather for the stage 0-2 refresh (its workspace <= 4 per element) and
       the fp32 buffer of zr_engine_get_params (a checkpoint's read) */
    double pool = rate_gathered * gathered + grad_bytes * computing + rate_inflight * inflight +
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
        size_t full_bytes = s->padded * zr_dtype_size(zr_engine_full_type(e));
        if (e->plan.params == ZR_REPLICATED) {
            if (!s->full_is_master) {
                mem.params += full_bytes;
            }
        } else if (s->full != NULL) {
            mem.gathered += full_bytes;
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
        zr_engine_pool_bytes(e->pool, &mem.pool, &mem.pool_peak);
    }
    return mem;
}
