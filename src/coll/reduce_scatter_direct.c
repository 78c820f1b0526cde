/*
 * reduce_scatter_direct.c - exact reduce-scatter (average), fp32 or bf16 on
 * the wire, fp32 accumulation: the ZeRO-3 gradient reduction.
 *
 * One all-to-all, then a local sum in rank order, then one division by the
 * group size. MPI cannot do this for bf16 (no bf16 sum) and does not promise
 * an order, so zr owns the reduction: every rank adds the same terms in the
 * same order, and a result is the same bits whichever rank computed it.
 *
 *   group of 3, in = partitions [x0 x1 x2] on each rank r (x_p^r), fp32 or bf16
 *
 *   cast           in -> the wire type, when they differ (a send buffer)
 *   all-to-all     rank0: x0^0 x0^1 x0^2   rank1: x1^0 x1^1 x1^2   rank2: x2^0 x2^1 x2^2
 *   sum, / 3       rank0: mean(x0)         rank1: mean(x1)         rank2: mean(x2)   (fp32)
 *
 * bf16 wire: each term is rounded to bf16 once (my own too, so no rank's
 * contribution is special), widened to fp32 and summed in fp32. A bf16 input
 * is already that rounding: it is sent as it is, with no send buffer, and the
 * result is the bits an fp32 input holding the same values gives. A bf16
 * input on an fp32 wire is widened exactly into the send buffer first.
 *
 * On a device transport the casts and the sum are kernels on the op's codec
 * stream (coll_local.c); the kernel adds in the same order and divides the
 * same way, so the result is the CPU's bits.
 */
#include "coll_direct.h"

static zr_dtype wire_dtype(zr_wire_type wire)
{
    return wire == ZR_WIRE_BF16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
}

/* Bytes of workspace the exchange needs (receive buffer always, send buffer for a cast input). */
size_t zr_reduce_scatter_direct_work(const zr_comm *c, zr_group g, zr_wire_type wire,
                                     zr_dtype in_type, size_t count)
{
    zr_dtype wt = wire_dtype(wire);
    size_t bytes = zr_coll_span((size_t)c->size[g] * count * zr_dtype_size(wt));
    return in_type == wt ? bytes : 2 * bytes;
}

zr_coll_cost zr_reduce_scatter_direct_cost(const zr_comm *c, zr_group g, zr_wire_type wire,
                                           zr_dtype in_type, size_t count)
{
    size_t n = (size_t)c->size[g];
    zr_dtype wt = wire_dtype(wire);
    zr_coll_cost k = {.kind = ZR_KIND_REDUCE_SCATTER,
                      .work = zr_reduce_scatter_direct_work(c, g, wire, in_type, count)};
    zr_coll_cost_send(c, g, count * zr_dtype_size(wt), 0, &k);
    if (in_type != wt) {
        /* every partition cast to the wire type */
        *(wt == ZR_DTYPE_BF16 ? &k.bf16_enc : &k.bf16_dec) += n * count;
    }
    if (wt == ZR_DTYPE_BF16) {
        k.bf16_dec += n * count; /* every received term widened by the sum */
    }
    k.f32_add = n * count;
    return k;
}

/* Lay the exchange buffers out at the start of the workspace. */
static void carve(zr_coll_op *op, zr_coll_direct *a, int n)
{
    unsigned char *cur = op->work;
    size_t bytes = (size_t)n * a->count * zr_dtype_size(wire_dtype(a->wire));
    a->recv = zr_coll_carve(&cur, bytes);
    a->send = a->in_type != wire_dtype(a->wire) ? zr_coll_carve(&cur, bytes) : NULL;
}

zr_status zr_reduce_scatter_direct_post(zr_comm *c, zr_coll_op *op, zr_kind kind, const void *in)
{
    zr_coll_direct *a = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    int n = c->size[a->group];
    zr_dtype wt = wire_dtype(a->wire);
    carve(op, a, n);
    const void *send = in;
    if (a->send != NULL) {
        ZR_CHECK(zr_coll_convert(L, x, wt, a->send, a->in_type, in, (size_t)n * a->count));
        send = a->send;
    }
    return zr_coll_ialltoall(c, op, a->group, kind, send, a->count * zr_dtype_size(wt), a->recv,
                             &op->req[0]);
}

zr_status zr_reduce_scatter_direct_finish(zr_comm *c, zr_coll_op *op, float *out)
{
    zr_coll_direct *a = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    return L->mean(x, out, a->recv, wire_dtype(a->wire), c->size[a->group], a->count, a->count);
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

zr_status zr_reduce_scatter_direct_start(zr_comm *c, zr_group g, zr_wire_type wire,
                                         zr_dtype in_type, const void *in, size_t count, float *out,
                                         zr_coll_op *op)
{
    zr_coll_direct *a;
    ZR_CHECK(zr_coll_begin(c, op, &algo, ZR_COLL_BIT(g), (void **)&a));
    zr_status st = zr_coll_reserve(op, zr_reduce_scatter_direct_work(c, g, wire, in_type, count));
    if (st != ZR_OK) {
        zr_coll_end(op);
        return st;
    }
    a->group = g;
    a->kind = ZR_KIND_REDUCE_SCATTER;
    a->wire = wire;
    a->in_type = in_type;
    a->in = in;
    a->count = count;
    a->out_type = ZR_DTYPE_F32;
    a->out = out;
    return zr_coll_kick(c, op);
}
