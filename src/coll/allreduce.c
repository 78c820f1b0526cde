/*
 * allreduce.c - exact all-reduce (average) in place, fp32 or bf16 on the
 * wire: a direct reduce-scatter followed by a direct all-gather of the
 * reduced partitions, over a copy of the buffer padded to n equal parts.
 *
 *   group of 3, buf = b (count elements, any count), per = ceil(count / 3)
 *
 *   pad            every rank: [b0 b1 b2] (b2 zero-padded to per elements)
 *   reduce-scatter rank0: mean(b0)   rank1: mean(b1)   rank2: mean(b2)
 *   all-gather     every rank: [mean(b0) mean(b1) mean(b2)] -> buf (count elements)
 *
 * Rank order summation and one division, as in reduce_scatter_direct.c, so
 * every rank ends with the same bits. With a bf16 wire each reduced value is
 * rounded to bf16 before the gather, mine included. On a device transport
 * the copies, casts and the sum run on the op's codec stream (coll_local.c).
 */
#include "coll_direct.h"

static zr_status advance(zr_comm *c, zr_coll_op *op, int block)
{
    zr_coll_direct *a = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    int n = c->size[a->group], me = c->rank[a->group];
    size_t per = a->count;
    if (op->phase == 0) {
        int ok = 0;
        ZR_CHECK(zr_coll_gate(c, op, a->group, block, &ok));
        if (!ok) {
            return ZR_OK;
        }
        ZR_CHECK(L->copy(x, a->pad, a->out, a->total * sizeof(float)));
        ZR_CHECK(L->zero(x, a->pad + a->total, ((size_t)n * per - a->total) * sizeof(float)));
        ZR_CHECK(zr_reduce_scatter_direct_post(c, op, ZR_KIND_ALLREDUCE, a->pad));
        op->phase = 1;
    }
    if (op->phase == 1) {
        int done = 0;
        ZR_CHECK(zr_coll_progress(c, &op->req[0], block, &done));
        if (!done) {
            return ZR_OK;
        }
        /* the reduce-scatter's sends are complete, so pad is free for the gather */
        float *mine = a->pad + (size_t)me * per;
        ZR_CHECK(zr_reduce_scatter_direct_finish(c, op, mine));
        if (a->wire == ZR_WIRE_BF16) {
            zr_bf16 *gathered = a->recv;
            ZR_CHECK(L->to_bf16(x, gathered + (size_t)me * per, mine, per));
            ZR_CHECK(zr_coll_iallgather(c, op, a->group, ZR_KIND_ALLREDUCE,
                                        gathered + (size_t)me * per, per * 2, gathered,
                                        &op->req[0]));
        } else {
            ZR_CHECK(zr_coll_iallgather(c, op, a->group, ZR_KIND_ALLREDUCE, mine, per * 4, a->pad,
                                        &op->req[0]));
        }
        zr_coll_posted_last(op, a->group);
        op->phase = 2;
    }
    int done = 0;
    ZR_CHECK(zr_coll_progress(c, &op->req[0], block, &done));
    if (!done) {
        return ZR_OK;
    }
    if (a->wire == ZR_WIRE_BF16) {
        ZR_CHECK(L->from_bf16(x, a->out, a->recv, a->total));
    } else {
        ZR_CHECK(L->copy(x, a->out, a->pad, a->total * sizeof(float)));
    }
    return zr_coll_finish(op);
}

static const zr_coll_algo algo = {"allreduce", advance};

/* Bytes of workspace the op reserves: the reduce-scatter's and the gathered blocks. */
static size_t work_bytes(const zr_comm *c, zr_group g, zr_wire_type wire, size_t count)
{
    size_t n = (size_t)c->size[g], per = zr_div_up(count, n);
    return zr_reduce_scatter_direct_work(c, g, wire, ZR_DTYPE_F32, per) +
           zr_coll_span(n * per * sizeof(float));
}

zr_coll_cost zr_allreduce_cost(const zr_comm *c, zr_group g, zr_wire_type wire, size_t count)
{
    size_t n = (size_t)c->size[g], per = zr_div_up(count, n), esize = wire == ZR_WIRE_BF16 ? 2 : 4;
    zr_coll_cost k = zr_reduce_scatter_direct_cost(c, g, wire, ZR_DTYPE_F32, per);
    k.kind = ZR_KIND_ALLREDUCE;
    k.work = work_bytes(c, g, wire, count);
    zr_coll_cost_send(c, g, per * esize, 1, &k); /* the gather of the reduced parts */
    if (wire == ZR_WIRE_BF16) {
        k.bf16_enc += per; /* my reduced part */
        k.bf16_dec += count;
    }
    return k;
}

zr_status zr_allreduce_start(zr_comm *c, zr_group g, const zr_wire *wire, float *buf, size_t count,
                             zr_coll_op *op)
{
    if (c == NULL || (unsigned)g >= ZR_GROUP_COUNT) {
        ZR_FAIL(ZR_ERR_INVALID, "all-reduce: NULL communicator or unknown group %d", (int)g);
    }
    if (count > 0 && buf == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "all-reduce: NULL buffer");
    }
    zr_wire_type t = wire != NULL ? wire->type : ZR_WIRE_F32;
    if (t != ZR_WIRE_F32 && t != ZR_WIRE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID,
                "all-reduce: wire must be ZR_WIRE_F32 or ZR_WIRE_BF16 (got %d); zr has no "
                "quantized all-reduce",
                (int)t);
    }
    int n = c->size[g];
    size_t per = zr_div_up(count, (size_t)n);
    zr_coll_direct *a;
    ZR_CHECK(zr_coll_begin(c, op, &algo, ZR_COLL_BIT(g), (void **)&a));
    zr_status st = zr_coll_reserve(op, work_bytes(c, g, t, count));
    if (st != ZR_OK) {
        zr_coll_end(op);
        return st;
    }
    a->group = g;
    a->kind = ZR_KIND_ALLREDUCE;
    a->wire = t;
    a->in_type = ZR_DTYPE_F32;
    a->count = per;
    a->total = count;
    a->out_type = ZR_DTYPE_F32;
    a->out = buf;
    a->pad = (float *)((unsigned char *)op->work +
                       zr_reduce_scatter_direct_work(c, g, t, ZR_DTYPE_F32, per));
    return zr_coll_kick(c, op);
}
