/*
 * reduce_scatter_direct.c - exact reduce-scatter (average), fp32 or bf16 on
 * the wire, fp32 accumulation: the ZeRO-3 gradient reduction.
 *
 * One all-to-all, then a local sum in rank order, then one division by the
 * group size. MPI cannot do this for bf16 (no bf16 sum) and does not promise
 * an order, so zr owns the reduction: every rank adds the same terms in the
 * same order, and a result is the same bits whichever rank computed it.
 *
 *   group of 3, in = partitions [x0 x1 x2] on each rank r (x_p^r)
 *
 *   all-to-all     rank0: x0^0 x0^1 x0^2   rank1: x1^0 x1^1 x1^2   rank2: x2^0 x2^1 x2^2
 *   sum, / 3       rank0: mean(x0)         rank1: mean(x1)         rank2: mean(x2)
 *
 * bf16 wire: each term is rounded to bf16 once (my own too, so no rank's
 * contribution is special), widened to fp32 and summed in fp32.
 *
 * On a device transport the casts and the sum are kernels on the op's codec
 * stream (coll_local.c); the kernel adds in the same order and divides the
 * same way, so the result is the CPU's bits.
 */
#include "coll_direct.h"

/* Bytes of workspace the exchange needs (send buffer for bf16, receive buffer always). */
size_t zr_reduce_scatter_direct_work(const zr_comm *c, zr_group g, zr_wire_type wire, size_t count)
{
    size_t n = (size_t)c->size[g];
    size_t esize = wire == ZR_WIRE_BF16 ? 2 : 4;
    size_t send = wire == ZR_WIRE_BF16 ? zr_coll_span(n * count * 2) : 0;
    return zr_coll_span(n * count * esize) + send;
}

zr_coll_cost zr_reduce_scatter_direct_cost(const zr_comm *c, zr_group g, zr_wire_type wire,
                                           size_t count)
{
    size_t n = (size_t)c->size[g];
    zr_coll_cost k = {.kind = ZR_KIND_REDUCE_SCATTER,
                      .work = zr_reduce_scatter_direct_work(c, g, wire, count)};
    zr_coll_cost_send(c, g, count * (wire == ZR_WIRE_BF16 ? 2 : 4), 0, &k);
    if (wire == ZR_WIRE_BF16) {
        k.bf16_enc = n * count;
        k.bf16_dec = n * count;
    }
    k.f32_add = n * count;
    return k;
}

/* Lay the exchange buffers out at the start of the workspace. */
static void carve(zr_coll_op *op, zr_coll_direct *a, int n)
{
    unsigned char *cur = op->work;
    size_t esize = a->wire == ZR_WIRE_BF16 ? 2 : 4;
    a->recv = zr_coll_carve(&cur, (size_t)n * a->count * esize);
    a->send = a->wire == ZR_WIRE_BF16 ? zr_coll_carve(&cur, (size_t)n * a->count * 2) : NULL;
}

zr_status zr_reduce_scatter_direct_post(zr_comm *c, zr_coll_op *op, zr_kind kind, const float *in)
{
    zr_coll_direct *a = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    int n = c->size[a->group];
    carve(op, a, n);
    const void *send = in;
    size_t esize = 4;
    if (a->wire == ZR_WIRE_BF16) {
        ZR_CHECK(L->to_bf16(x, a->send, in, (size_t)n * a->count));
        send = a->send;
        esize = 2;
    }
    return zr_coll_ialltoall(c, op, a->group, kind, send, a->count * esize, a->recv, &op->req[0]);
}

zr_status zr_reduce_scatter_direct_finish(zr_comm *c, zr_coll_op *op, float *out)
{
    zr_coll_direct *a = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    zr_dtype t = a->wire == ZR_WIRE_BF16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
    return L->mean(x, out, a->recv, t, c->size[a->group], a->count, a->count);
}

static zr_status advance(zr_comm *c, zr_coll_op *op, int block)
{
    zr_coll_direct *a = zr_coll_algo_state(op);
    if (op->phase == 0) {
        int ok = 0;
        ZR_CHECK(zr_coll_gate(c, op, a->group, block, &ok));
        if (!ok) {
            return ZR_OK;
        }
        ZR_CHECK(zr_reduce_scatter_direct_post(c, op, ZR_KIND_REDUCE_SCATTER, a->in));
        zr_coll_posted_last(op, a->group);
        op->phase = 1;
    }
    int done = 0;
    ZR_CHECK(zr_coll_progress(c, &op->req[0], block, &done));
    if (!done) {
        return ZR_OK;
    }
    ZR_CHECK(zr_reduce_scatter_direct_finish(c, op, a->out));
    return zr_coll_finish(op);
}

static const zr_coll_algo algo = {"reduce_scatter_direct", advance};

zr_status zr_reduce_scatter_direct_start(zr_comm *c, zr_group g, zr_wire_type wire, const float *in,
                                         size_t count, float *out, zr_coll_op *op)
{
    zr_coll_direct *a;
    ZR_CHECK(zr_coll_begin(c, op, &algo, ZR_COLL_BIT(g), (void **)&a));
    zr_status st = zr_coll_reserve(op, zr_reduce_scatter_direct_work(c, g, wire, count));
    if (st != ZR_OK) {
        zr_coll_end(op);
        return st;
    }
    a->group = g;
    a->kind = ZR_KIND_REDUCE_SCATTER;
    a->wire = wire;
    a->in_type = ZR_DTYPE_F32;
    a->in = in;
    a->count = count;
    a->out = out;
    return zr_coll_kick(c, op);
}
