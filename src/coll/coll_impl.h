/*
 * coll_impl.h - what the algorithm files of src/coll share: the per-op
 * state behind zr_coll_op.impl, workspace carving, and the posting gate.
 *
 * Life of an op: an algorithm's *_start checks its arguments, calls
 * zr_coll_begin (which allocates the state on first use and registers the op),
 * fills in its part of the state and calls zr_coll_kick, which runs the
 * op's advance function once without blocking: that posts the first exchange.
 * zr_coll_test / zr_coll_wait run advance again until the op reaches its end
 * (zr_coll_end).
 *
 * The posting gate. The transport matches concurrent exchanges of one group
 * by posting order (one tag per communicator), so every rank must post the
 * exchanges of a group in the same order. Exchanges posted inside *_start are
 * in program order, but a multi-phase op (all-reduce, qgZ) posts its later
 * phases when its earlier ones complete, which depends on timing. So an op
 * registers, at start, the groups it will still post on; it may post on group
 * g only when no op started before it (same communicator) still has g
 * pending. A gated op in zr_coll_test progresses the ops ahead of it; in
 * zr_coll_wait it completes them. The order of posts on each group is then
 * "ops in start order, each op's posts in its own order", the same on every
 * rank.
 */
#ifndef ZR_COLL_IMPL_H
#define ZR_COLL_IMPL_H

#include "zr/coll.h"

/* Direct all-gather / reduce-scatter (one exchange each) and their composition. */
typedef struct zr_coll_direct {
    zr_group group;
    zr_kind kind;
    zr_wire_type wire;
    zr_dtype in_type;
    const void *in;
    size_t count; /* elements per partition (the padded partition for all-reduce) */
    size_t total; /* all-reduce: caller's element count */
    float *out;
    void *send, *recv; /* carved from op->work */
    float *pad;        /* all-reduce: the padded fp32 buffer */
} zr_coll_direct;

/* qwZ: one quantized block per rank. */
typedef struct zr_coll_qwz {
    zr_group group;
    zr_kind kind;
    zr_qparams q;
    zr_dtype in_type;
    const void *in;
    size_t count, block; /* elements per rank, bytes per block */
    float *out;
    unsigned char *blocks; /* size[group] blocks, carved from op->work */
} zr_coll_qwz;

/* qgZ: two quantized all-to-all hops, pipelined over chunks. */
#define ZR_QGZ_SLOTS 2 /* chunks in flight per hop: op->req[slot] intra, req[2+slot] inter */

typedef struct zr_coll_qgz {
    zr_qparams q;
    zr_dtype in_type;
    const void *in;
    size_t count;
    float *out;
    zr_qgz_feedback *fb;             /* NULL without error feedback */
    float mul;                       /* 1/W, applied at the first quantization */
    int W, D, N, d;                  /* world, ranks per node, nodes, my rank in the node */
    size_t groups;                   /* quantization groups per partition */
    int chunks;                      /* effective chunk count (<= groups) */
    int next_encode;                 /* first chunk whose intra hop is not posted yet */
    int next_reduce;                 /* first chunk whose intra hop is not reduced yet */
    int next_final;                  /* first chunk whose inter hop is not summed yet */
    size_t slot_bytes1, slot_bytes2; /* hop-1 and hop-2 buffer bytes per slot */
    unsigned char *send1[ZR_QGZ_SLOTS], *recv1[ZR_QGZ_SLOTS];
    unsigned char *send2[ZR_QGZ_SLOTS], *recv2[ZR_QGZ_SLOTS];
    const void **blocks; /* D pointers for zr_quant_sum_requant, carved from op->work */
} zr_coll_qgz;

typedef struct zr_coll_state {
    zr_comm *comm;
    struct zr_coll_op *op;
    struct zr_coll_state *prev, *next; /* registry of ops with posts pending, start order */
    unsigned pending;                  /* bit g: this op will still post on group g */
    int registered;
    union {
        zr_coll_direct direct;
        zr_coll_qwz qwz;
        zr_coll_qgz qgz;
    } u;
} zr_coll_state;

typedef zr_status (*zr_coll_advance_fn)(zr_comm *c, zr_coll_op *op, int block);

#define ZR_COLL_BIT(g) (1u << (unsigned)(g))

/* Begin an op: fails if it is in flight; registers it for the groups in pending. */
zr_status zr_coll_begin(zr_comm *c, zr_coll_op *op, unsigned pending, zr_coll_advance_fn advance,
                        zr_coll_state **st);

/* Run advance once without blocking (posts the first exchange when the gate allows). */
zr_status zr_coll_kick(zr_comm *c, zr_coll_op *op);

/*
 * May op post on group g now? Progresses (block = 0) or completes (block = 1)
 * the earlier ops that hold g; *ok = 1 when the way is clear (always with block).
 */
zr_status zr_coll_gate(zr_comm *c, zr_coll_op *op, zr_group g, int block, int *ok);

/* The op has made its last post on group g. */
void zr_coll_posted_last(zr_coll_op *op, zr_group g);

/* The op is complete. */
void zr_coll_end(zr_coll_op *op);

/* An advance step failed: drain the op's requests, end it, return st. */
zr_status zr_coll_fail(zr_comm *c, zr_coll_op *op, zr_status st);

/* Make op->work hold at least bytes (contents are not kept when it grows). */
zr_status zr_coll_reserve(zr_coll_op *op, size_t bytes);

/* Carve the next 64-byte aligned piece of bytes from the workspace cursor. */
static inline void *zr_coll_carve(unsigned char **cursor, size_t bytes)
{
    void *p = *cursor;
    *cursor += zr_round_up(bytes, ZR_ALIGN);
    return p;
}

/* Bytes zr_coll_carve uses for a piece of bytes. */
static inline size_t zr_coll_span(size_t bytes)
{
    return zr_round_up(bytes, ZR_ALIGN);
}

/* Wait (block) or test one request; *done = 1 once it is complete. */
zr_status zr_coll_progress(zr_comm *c, zr_request *req, int block, int *done);

/* Non-finite groups recorded in the header of a validated block. */
size_t zr_coll_block_nonfinite(const void *block);

/* Algorithm entry points behind the public dispatchers in coll.c. */
zr_status zr_allgather_direct_start(zr_comm *c, zr_group g, zr_kind kind, zr_wire_type wire,
                                    zr_dtype in_type, const void *in, size_t count, float *out,
                                    zr_coll_op *op);
zr_status zr_allgather_qwz_start(zr_comm *c, zr_group g, zr_kind kind, const zr_qparams *q,
                                 zr_dtype in_type, const void *in, size_t count, float *out,
                                 zr_coll_op *op);
zr_status zr_reduce_scatter_direct_start(zr_comm *c, zr_group g, zr_wire_type wire, const float *in,
                                         size_t count, float *out, zr_coll_op *op);

/*
 * The halves of the direct algorithms, shared with the all-reduce (which
 * chains them over a padded buffer). The post functions fill st->u.direct's
 * send buffer and post; the finish functions turn the received bytes into
 * fp32 output.
 */
zr_status zr_rs_direct_post(zr_comm *c, zr_coll_op *op, zr_kind kind, const float *in);
void zr_rs_direct_finish(zr_comm *c, zr_coll_op *op, float *out);
size_t zr_rs_direct_work(const zr_comm *c, zr_group g, zr_wire_type wire, size_t count);
size_t zr_allgather_direct_work(const zr_comm *c, zr_group g, zr_wire_type wire, zr_dtype in_type,
                                size_t count);
size_t zr_allgather_qwz_work(const zr_comm *c, zr_group g, const zr_qparams *q, size_t count);

#endif /* ZR_COLL_IMPL_H */
