/*
 * allgather_qwz.c - qwZ, the quantized weight all-gather (INT8 by default,
 * INT4 on request), over any group (world for the forward gather, hpZ for
 * the backward one).
 *
 * Each rank quantizes its shard into ONE self-describing block (header,
 * scales, payload; zr/quant.h) written straight into its own slot of the
 * receive buffer, so the exchange is an in-place all-gather of equal blocks
 * and one message per peer carries data and scales together.
 *
 *   group of 3, shards a b c, Q(x) = quantized block of x, B = block bytes
 *
 *   encode         rank0: [Q(a) .    .   ]  rank1: [.    Q(b) .   ]  ...   (fp32 or bf16 in)
 *   all-gather     every rank: [Q(a) Q(b) Q(c)]     (B bytes per peer)
 *   validate+decode every rank: out = [a' b' c'],  |x - x'| <= scale   (fp32 or bf16 out)
 *
 * Every received block is validated (magic, bits, group, element count,
 * size) before it is decoded, and my own block is decoded like the others,
 * so all ranks hold the same dequantized weights. A bf16 output is decoded
 * straight into bf16 (the fp32 dequantized value rounded, zr/quant.h), with
 * no fp32 copy between. The non-finite group counts of the received headers
 * add up in op->nonfinite, the same on every rank.
 *
 * On a device transport the encode and the decodes are kernels on the op's
 * codec stream and the exchange follows it (coll_local.c); the headers are
 * validated when the op completes, with the same messages.
 */
#include "coll_algo.h"

/* qwZ's state: one quantized block per rank. */
typedef struct qwz_state {
    zr_group group;
    zr_kind kind;
    zr_quant_params q;
    zr_dtype in_type;
    const void *in;
    size_t count, block; /* elements per rank, bytes per block */
    zr_dtype out_type;
    void *out;
    unsigned char *blocks; /* size[group] blocks, carved from op->work */
} qwz_state;

_Static_assert(sizeof(qwz_state) <= ZR_COLL_STATE_BYTES, "qwZ state fits in an op");

/* Validate every received block (mine too), then decode it into its slot of out. */
static zr_status decode_all(zr_comm *c, zr_coll_op *op)
{
    qwz_state *w = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    int n = c->size[w->group];
    zr_coll_check k = {"qwZ", w->group, 0, w->block, w->count, w->q, 1};
    for (int p = 0; p < n; p++) {
        const unsigned char *blk = w->blocks + (size_t)p * w->block;
        k.peer = p;
        ZR_CHECK(L->check(x, c, op, blk, &k));
        unsigned char *slot =
            (unsigned char *)w->out + (size_t)p * w->count * zr_dtype_size(w->out_type);
        ZR_CHECK(L->decode(x, blk, w->out_type, slot, w->count));
    }
    return ZR_OK;
}

static zr_status advance(zr_comm *c, zr_coll_op *op, int block)
{
    qwz_state *w = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    if (op->phase == 0) {
        int ok = 0;
        ZR_CHECK(zr_coll_gate(c, op, w->group, block, &ok));
        if (!ok) {
            return ZR_OK;
        }
        unsigned char *own = w->blocks + (size_t)c->rank[w->group] * w->block;
        ZR_CHECK(L->encode(x, &w->q, w->in_type, w->in, w->count, 1.0f, NULL, own));
        ZR_CHECK(
            zr_coll_iallgather(c, op, w->group, w->kind, own, w->block, w->blocks, &op->req[0]));
        zr_coll_posted_last(op, w->group);
        op->phase = 1;
    }
    int done = 0;
    ZR_CHECK(zr_coll_progress(c, &op->req[0], block, &done));
    if (!done) {
        return ZR_OK;
    }
    ZR_CHECK(decode_all(c, op));
    return zr_coll_finish(op);
}

static const zr_coll_algo algo = {"allgather_qwz", advance};

/* Bytes of workspace the op reserves (its cost's .work). */
static size_t work_bytes(const zr_comm *c, zr_group g, const zr_quant_params *q, size_t count)
{
    return (size_t)c->size[g] * zr_quant_block_bytes(q, count);
}

zr_coll_cost zr_allgather_qwz_cost(const zr_comm *c, zr_group g, zr_kind kind,
                                   const zr_quant_params *q, size_t count)
{
    zr_coll_cost k = {.kind = kind, .work = work_bytes(c, g, q, count)};
    zr_coll_cost_send(c, g, zr_quant_block_bytes(q, count), 0, &k);
    k.q_enc = count;
    k.q_dec = (size_t)c->size[g] * count;
    k.q_bits = q->bits;
    return k;
}

zr_status zr_allgather_qwz_start(zr_comm *c, zr_group g, zr_kind kind, const zr_quant_params *q,
                                 zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                                 void *out, zr_coll_op *op)
{
    ZR_CHECK(zr_quant_params_check(q));
    size_t bytes = zr_quant_block_bytes(q, count);
    qwz_state *w;
    ZR_CHECK(zr_coll_begin(c, op, &algo, ZR_COLL_BIT(g), (void **)&w));
    zr_status st = zr_coll_reserve(op, work_bytes(c, g, q, count));
    if (st != ZR_OK) {
        zr_coll_end(op);
        return st;
    }
    w->group = g;
    w->kind = kind;
    w->q = *q;
    w->in_type = in_type;
    w->in = in;
    w->count = count;
    w->block = bytes;
    w->out_type = out_type;
    w->out = out;
    w->blocks = op->work;
    void *x;
    st = zr_coll_local_of(op, &x)->expect_checks(x, (size_t)c->size[g]);
    if (st != ZR_OK) {
        zr_coll_end(op);
        return st;
    }
    return zr_coll_kick(c, op);
}
