/*
 * allgather_direct.c - exact all-gather, fp32 or bf16 on the wire: the
 * ZeRO-3 weight gather every ZeRO++ number is compared against.
 *
 * One exchange: every rank sends its shard to every peer of the group (the
 * direct algorithm, so each byte crosses one link once and the accounting
 * sees exactly who sent what where).
 *
 *   group of 3, shards a b c; in, wire and out each fp32 or bf16
 *
 *   before         rank0: a          rank1: b          rank2: c
 *   own slot       rank0: [a . .]    rank1: [. b .]    rank2: [. . c]  (cast to the wire type)
 *   exchange       rank0: [a b c]    rank1: [a b c]    rank2: [a b c]  (wire type)
 *   after          out = [a b c] in the output type on every rank
 *
 * The exchange lands in out itself when the output is of the wire type
 * (fp32 into fp32, bf16 into bf16: no workspace, no cast after), else in a
 * workspace of the wire type that is cast into out afterwards. An input of
 * another type than the wire is cast into my own slot of that receive
 * buffer and sent from there (an in-place all-gather); one of the wire type
 * is sent as it is. So a value is converted at most twice, in to wire and
 * wire to out, and a bf16 output is the fp32 one rounded to bf16.
 *
 * bf16 wire: my own shard is rounded to bf16 like everyone else's copy of
 * it, so every rank holds the same bits afterwards (ranks that disagree on
 * the weights would compute different forward passes).
 *
 * On a communicator with a device transport, in, out and the workspace are
 * device memory and the casts are kernels on the op's codec stream (the
 * local-work table, coll_local.c): the same schedule, the same bits.
 */
#include "coll_direct.h"

static zr_dtype wire_dtype(zr_wire_type wire)
{
    return wire == ZR_WIRE_BF16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
}

static zr_status advance(zr_comm *c, zr_coll_op *op, int block)
{
    zr_coll_direct *a = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    int n = c->size[a->group], me = c->rank[a->group];
    zr_dtype wt = wire_dtype(a->wire);
    size_t esize = zr_dtype_size(wt);
    if (op->phase == 0) {
        int ok = 0;
        ZR_CHECK(zr_coll_gate(c, op, a->group, block, &ok));
        if (!ok) {
            return ZR_OK;
        }
        const void *send = a->in;
        if (a->in_type != wt) {
            unsigned char *own = (unsigned char *)a->recv + (size_t)me * a->count * esize;
            ZR_CHECK(zr_coll_convert(L, x, wt, own, a->in_type, a->in, a->count));
            send = own;
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
    if (a->out_type != wt) {
        ZR_CHECK(zr_coll_convert(L, x, a->out_type, a->out, wt, a->recv, (size_t)n * a->count));
    }
    return zr_coll_finish(op);
}

static const zr_coll_algo algo = {"allgather_direct", advance};

/* Bytes of workspace the op reserves (its cost's .work): the wire's receive buffer, unless out. */
static size_t work_bytes(const zr_comm *c, zr_group g, zr_wire_type wire, zr_dtype out_type,
                         size_t count)
{
    zr_dtype wt = wire_dtype(wire);
    return out_type == wt ? 0 : zr_coll_span((size_t)c->size[g] * count * zr_dtype_size(wt));
}

zr_coll_cost zr_allgather_direct_cost(const zr_comm *c, zr_group g, zr_kind kind, zr_wire_type wire,
                                      zr_dtype in_type, size_t count, zr_dtype out_type)
{
    size_t n = (size_t)c->size[g];
    zr_dtype wt = wire_dtype(wire);
    zr_coll_cost k = {.kind = kind, .work = work_bytes(c, g, wire, out_type, count)};
    zr_coll_cost_send(c, g, count * zr_dtype_size(wt), 0, &k);
    /* in -> wire: my shard; wire -> out: every shard */
    size_t *to_in = wt == ZR_DTYPE_BF16 ? &k.bf16_enc : &k.bf16_dec;
    size_t *to_out = out_type == ZR_DTYPE_BF16 ? &k.bf16_enc : &k.bf16_dec;
    *to_in += in_type != wt ? count : 0;
    *to_out += out_type != wt ? n * count : 0;
    return k;
}

zr_status zr_allgather_direct_start(zr_comm *c, zr_group g, zr_kind kind, zr_wire_type wire,
                                    zr_dtype in_type, const void *in, size_t count,
                                    zr_dtype out_type, void *out, zr_coll_op *op)
{
    zr_coll_direct *a;
    ZR_CHECK(zr_coll_begin(c, op, &algo, ZR_COLL_BIT(g), (void **)&a));
    zr_status st = zr_coll_reserve(op, work_bytes(c, g, wire, out_type, count));
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
    a->out_type = out_type;
    a->out = out;
    a->recv = out_type == wire_dtype(wire) ? out : op->work;
    return zr_coll_kick(c, op);
}
