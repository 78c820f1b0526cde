/*
 * exchange.c - the engine's door to the collectives: every collective the
 * engine starts or waits for goes through here, and so does what a dry
 * engine reports instead (zr/zero.h, "Dry runs").
 *
 * A dry collective is not started: its op's workspace grows to what the
 * algorithm would reserve (as zr_coll_reserve grows it: to the largest
 * request, kept), the observer hears what it would send and convert
 * (zr_coll_cost, from the algorithm's own file), and it is complete when the
 * engine waits for it. The engine's code above this door is the same for
 * both, so a dry run takes every decision the real run takes. Waits go
 * through the engine's buffer table (zr_engine_bufs: the host times them, a
 * device marks its stream, a dry engine reports them).
 */
#include "zero_impl.h"

static void report(zr_engine *e, const zr_engine_event *ev)
{
    e->dry.event(e->dry.ctx, ev);
}

static zr_status post_dry(zr_engine *e, zr_coll_op *op, const zr_coll_cost *k)
{
    if (k->work > op->work_cap) {
        op->work_cap = k->work;
    }
    zr_engine_event ev = {.type = ZR_ENGINE_POST, .op = op, .cost = *k};
    report(e, &ev);
    return ZR_OK;
}

zr_status zr_engine_allgather(zr_engine *e, zr_group g, zr_kind kind, const zr_wire *wire,
                              zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                              void *out, zr_coll_op *op)
{
    if (zr_engine_is_dry(e)) {
        zr_coll_cost k = zr_allgather_cost(e->comm, g, kind, wire, in_type, count, out_type);
        return post_dry(e, op, &k);
    }
    return zr_allgather_start(e->comm, g, kind, wire, in_type, in, count, out_type, out, op);
}

zr_status zr_engine_reduce_scatter(zr_engine *e, zr_dtype in_type, const void *in, size_t count,
                                   float *out, zr_coll_op *op)
{
    const zr_wire *wire = &e->cfg.grad_wire;
    if (zr_engine_is_dry(e)) {
        zr_coll_cost k = zr_reduce_scatter_cost(e->comm, ZR_GROUP_WORLD, wire, in_type, count);
        return post_dry(e, op, &k);
    }
    return zr_reduce_scatter_start(e->comm, ZR_GROUP_WORLD, wire, in_type, in, count, out, op);
}

zr_status zr_engine_allreduce(zr_engine *e, float *buf, size_t count, zr_coll_op *op)
{
    if (zr_engine_is_dry(e)) {
        zr_coll_cost k = zr_allreduce_cost(e->comm, ZR_GROUP_WORLD, e->cfg.grad_wire.type, count);
        return post_dry(e, op, &k);
    }
    return zr_allreduce_start(e->comm, ZR_GROUP_WORLD, &e->cfg.grad_wire, buf, count, op);
}

zr_status zr_engine_qgz(zr_engine *e, zr_dtype in_type, const void *in, size_t count, float *out,
                        zr_qgz_feedback *fb, zr_coll_op *op)
{
    const zr_qgz_config *cfg = &e->cfg.qgz_cfg;
    if (zr_engine_is_dry(e)) {
        zr_coll_cost k = zr_qgz_cost(e->comm, cfg, count);
        return post_dry(e, op, &k);
    }
    return zr_qgz_start(e->comm, cfg, in_type, in, count, out, cfg->error_feedback ? fb : NULL, op);
}

zr_status zr_engine_wait(zr_engine *e, zr_coll_op *op)
{
    return e->bufs->wait(e, op, zr_now());
}

zr_status zr_engine_gather_slices(zr_engine *e, zr_unit_state *s, const float *mine, void *buf,
                                  zr_dtype type, const zr_wire *wire)
{
    zr_coll_op *op;
    ZR_CHECK(zr_engine_pool_get_op(e->pool, &op));
    double t0 = zr_now(); /* the host counts the start too: it blocks the caller as well */
    zr_status st;
    ZR_CHECK_GOTO(zr_engine_allgather(e, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, wire, ZR_DTYPE_F32,
                                      mine, s->shard, type, buf, op),
                  st, done);
    st = e->bufs->wait(e, op, t0);
done:
    zr_engine_pool_put_op(e->pool, op);
    return st;
}

void zr_engine_report_work(zr_engine *e, zr_engine_work work, size_t elements)
{
    if (zr_engine_is_dry(e)) {
        zr_engine_event ev = {.type = ZR_ENGINE_WORK, .work = work, .elements = elements};
        report(e, &ev);
    }
}

void zr_engine_note_compute(zr_engine *e, int u, zr_phase phase)
{
    if (zr_engine_is_dry(e)) {
        zr_engine_event ev = {.type = ZR_ENGINE_COMPUTE, .unit = u, .phase = phase};
        report(e, &ev);
    }
}
