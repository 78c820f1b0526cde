/*
 * coll_dispatch.c - the public collectives that have more than one
 * algorithm behind them, and the blocking conveniences.
 *
 * zr_allgather_start picks the exact all-gather (fp32 or bf16 on the wire)
 * or qwZ (quantized wire); zr_reduce_scatter_start takes the exact
 * reduce-scatter and sends a quantized wire to qgZ's own entry point. The
 * arguments every algorithm shares are checked here, once; the op core
 * (coll.c) never sees which algorithm was chosen.
 */
#include "coll_algo.h"

static zr_status check_group(const zr_comm *c, zr_group g, const char *what)
{
    if ((unsigned)g >= ZR_GROUP_COUNT) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: unknown group %d", what, (int)g);
    }
    if (c == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: NULL communicator", what);
    }
    return ZR_OK;
}

static zr_status check_dtype(zr_dtype t, const char *what, const char *which)
{
    if (t != ZR_DTYPE_F32 && t != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: %s type must be fp32 or bf16, got %d", what, which, (int)t);
    }
    return ZR_OK;
}

zr_coll_cost zr_allgather_cost(const zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire,
                               zr_dtype in_type, size_t count, zr_dtype out_type)
{
    if (wire != NULL && wire->type == ZR_WIRE_QUANT) {
        /* the decode writes either type: no conversion of its own */
        return zr_allgather_qwz_cost(c, g, kind, &wire->q, count);
    }
    return zr_allgather_direct_cost(c, g, kind, wire != NULL ? wire->type : ZR_WIRE_F32, in_type,
                                    count, out_type);
}

zr_coll_cost zr_reduce_scatter_cost(const zr_comm *c, zr_group g, const zr_wire *wire,
                                    zr_dtype in_type, size_t count)
{
    return zr_reduce_scatter_direct_cost(c, g, wire != NULL ? wire->type : ZR_WIRE_F32, in_type,
                                         count);
}

zr_status zr_allgather_start(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire,
                             zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                             void *out, zr_coll_op *op)
{
    ZR_CHECK(check_group(c, g, "all-gather"));
    if ((unsigned)kind >= ZR_KIND_COUNT) {
        ZR_FAIL(ZR_ERR_INVALID, "all-gather: unknown traffic kind %d", (int)kind);
    }
    ZR_CHECK(check_dtype(in_type, "all-gather", "input"));
    ZR_CHECK(check_dtype(out_type, "all-gather", "output"));
    if (count > 0 && (in == NULL || out == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "all-gather: NULL %s buffer", in == NULL ? "input" : "output");
    }
    zr_wire_type t = wire != NULL ? wire->type : ZR_WIRE_F32;
    switch (t) {
    case ZR_WIRE_F32:
    case ZR_WIRE_BF16:
        return zr_allgather_direct_start(c, g, kind, t, in_type, in, count, out_type, out, op);
    case ZR_WIRE_QUANT:
        return zr_allgather_qwz_start(c, g, kind, &wire->q, in_type, in, count, out_type, out, op);
    }
    ZR_FAIL(ZR_ERR_INVALID, "all-gather: unknown wire type %d", (int)t);
}

zr_status zr_reduce_scatter_start(zr_comm *c, zr_group g, const zr_wire *wire, zr_dtype in_type,
                                  const void *in, size_t count, float *out, zr_coll_op *op)
{
    ZR_CHECK(check_group(c, g, "reduce-scatter"));
    ZR_CHECK(check_dtype(in_type, "reduce-scatter", "input"));
    if (count > 0 && (in == NULL || out == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "reduce-scatter: NULL %s buffer", in == NULL ? "input" : "output");
    }
    zr_wire_type t = wire != NULL ? wire->type : ZR_WIRE_F32;
    if (t == ZR_WIRE_QUANT) {
        ZR_FAIL(ZR_ERR_INVALID, "reduce-scatter: a quantized wire is qgZ's job (zr_qgz_start); "
                                "the exact reduce-scatter takes ZR_WIRE_F32 or ZR_WIRE_BF16");
    }
    if (t != ZR_WIRE_F32 && t != ZR_WIRE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "reduce-scatter: unknown wire type %d", (int)t);
    }
    return zr_reduce_scatter_direct_start(c, g, t, in_type, in, count, out, op);
}

/* ---- public: blocking conveniences ------------------------------------------ */

zr_status zr_allgather(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire, zr_dtype in_type,
                       const void *in, size_t count, zr_dtype out_type, void *out, zr_coll_op *op)
{
    ZR_CHECK(zr_allgather_start(c, g, kind, wire, in_type, in, count, out_type, out, op));
    return zr_coll_wait(c, op);
}

zr_status zr_reduce_scatter(zr_comm *c, zr_group g, const zr_wire *wire, zr_dtype in_type,
                            const void *in, size_t count, float *out, zr_coll_op *op)
{
    ZR_CHECK(zr_reduce_scatter_start(c, g, wire, in_type, in, count, out, op));
    return zr_coll_wait(c, op);
}

zr_status zr_allreduce(zr_comm *c, zr_group g, const zr_wire *wire, float *buf, size_t count,
                       zr_coll_op *op)
{
    ZR_CHECK(zr_allreduce_start(c, g, wire, buf, count, op));
    return zr_coll_wait(c, op);
}

zr_status zr_qgz(zr_comm *c, const zr_qgz_config *cfg, zr_dtype in_type, const void *in,
                 size_t count, float *out, zr_qgz_feedback *fb, zr_coll_op *op)
{
    ZR_CHECK(zr_qgz_start(c, cfg, in_type, in, count, out, fb, op));
    return zr_coll_wait(c, op);
}
