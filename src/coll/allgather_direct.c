/*
 * allgather_direct.c - exact all-gather, fp32 or bf16 on the wire: the
 * ZeRO-3 weight gather every ZeRO++ number is compared against.
 *
 * One exchange: every rank sends its shard to every peer of the group (the
 * direct algorithm, so each byte crosses one link once and the accounting
 * sees exactly who sent what where).
 *
 *   group of 3, shards a b c (fp32 or bf16 in; the wire type decides the bytes)
 *
 *   before         rank0: a          rank1: b          rank2: c
 *   exchange       rank0: a b c      rank1: a b c      rank2: a b c   (wire type)
 *   after          out = fp32 [a b c] on every rank
 *
 * bf16 wire: my own shard is rounded to bf16 like everyone else's copy of
 * it, so every rank holds the same bits afterwards (ranks that disagree on
 * the weights would compute different forward passes).
 *
 * fp32 wire: the exchange writes straight into out (no workspace); a bf16
 * input is widened into my own slot of out first and sent from there.
 *
 * On a communicator with a device transport, in, out and the workspace are
 * device memory and the casts are kernels on the op's codec stream (the
 * local-work table, coll_local.c): the same schedule, the same bits.
 */
#include "coll_direct.h"

static zr_status advance(zr_comm *c, zr_coll_op *op, int block)
{
    zr_coll_direct *a = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    int n = c->size[a->group], me = c->rank[a->group];
    if (op->phase == 0) {
        int ok = 0;
        ZR_CHECK(zr_coll_gate(c, op, a->group, block, &ok));
        if (!ok) {
            return ZR_OK;
        }
        const void *send = a->in;
        size_t esize = 4;
        if (a->wire == ZR_WIRE_F32) {
            if (a->in_type == ZR_DTYPE_BF16) {
                float *own = a->out + (size_t)me * a->count;
                ZR_CHECK(L->from_bf16(x, own, a->in, a->count));
                send = own;
            }
            a->recv = a->out;
        } else {
            esize = 2;
            if (a->in_type == ZR_DTYPE_F32) {
                ZR_CHECK(L->to_bf16(x, a->send, a->in, a->count));
                send = a->send;
            }
        }
        ZR_CHECK(zr_coll_iallgather(c, op, a->group, a->kind, send, a->count * esize, a->recv,
                                    &op->req[0]));
        zr_coll_posted_last(op, a->group);
        op->phase = 1;
    }
    int done = 0;
    ZR_CHECK(zr_coll_progress(c, &op->req[0], block, &done));
    if (!done) {
        return ZR_OK;
    }
    if (a->wire == ZR_WIRE_BF16) {
        ZR_CHECK(L->from_bf16(x, a->out, a->recv, (size_t)n * a->count));
    }
    return zr_coll_finish(op);
}

static const zr_coll_algo algo = {"allgather_direct", advance};

/* Bytes of workspace the op reserves (its cost's .work). */
static size_t work_bytes(const zr_comm *c, zr_group g, zr_wire_type wire, zr_dtype in_type,
                         size_t count)
{
    size_t n = (size_t)c->size[g];
    if (wire != ZR_WIRE_BF16) {
        return 0;
    }
    return zr_coll_span(n * count * 2) + (in_type == ZR_DTYPE_F32 ? zr_coll_span(count * 2) : 0);
}

zr_coll_cost zr_allgather_direct_cost(const zr_comm *c, zr_group g, zr_kind kind, zr_wire_type wire,
                                      zr_dtype in_type, size_t count)
{
    size_t n = (size_t)c->size[g];
    zr_coll_cost k = {.kind = kind, .work = work_bytes(c, g, wire, in_type, count)};
    zr_coll_cost_send(c, g, count * (wire == ZR_WIRE_BF16 ? 2 : 4), 0, &k);
    if (wire == ZR_WIRE_BF16) {
        k.bf16_enc = in_type == ZR_DTYPE_F32 ? count : 0;
        k.bf16_dec = n * count;
    } else if (in_type == ZR_DTYPE_BF16) {
        k.bf16_dec = count; /* my own shard, widened into out */
    }
    return k;
}

zr_status zr_allgather_direct_start(zr_comm *c, zr_group g, zr_kind kind, zr_wire_type wire,
                                    zr_dtype in_type, const void *in, size_t count, float *out,
                                    zr_coll_op *op)
{
    int n = c->size[g];
    size_t work = work_bytes(c, g, wire, in_type, count);
    zr_coll_direct *a;
    ZR_CHECK(zr_coll_begin(c, op, &algo, ZR_COLL_BIT(g), (void **)&a));
    zr_status st = zr_coll_reserve(op, work);
    if (st != ZR_OK) {
        zr_coll_end(op);
        return st;
    }
    a->group = g;
    a->kind = kind;
    a->wire = wire;
    a->in_type = in_type;
    a->in = in;
    a->count = count;
    a->out = out;
    if (wire == ZR_WIRE_BF16) {
        unsigned char *cur = op->work;
        a->recv = zr_coll_carve(&cur, (size_t)n * count * 2);
        a->send = in_type == ZR_DTYPE_F32 ? zr_coll_carve(&cur, count * 2) : NULL;
    }
    return zr_coll_kick(c, op);
}
