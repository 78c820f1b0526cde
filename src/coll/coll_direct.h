/*
 * coll_direct.h - what the exact (direct) algorithms share: their per-op
 * state, and the halves of the direct reduce-scatter, which the all-reduce
 * chains with an all-gather over a padded buffer (allreduce.c).
 */
#ifndef ZR_COLL_DIRECT_H
#define ZR_COLL_DIRECT_H

#include "coll_algo.h"

/* Direct all-gather / reduce-scatter (one exchange each) and their composition. */
typedef struct zr_coll_direct {
    zr_group group;
    zr_kind kind;
    zr_wire_type wire;
    zr_dtype in_type;
    const void *in;
    size_t count; /* elements per partition (the padded partition for all-reduce) */
    size_t total; /* all-reduce: caller's element count */
    zr_dtype out_type;
    void *out;         /* out_type; the reduce-scatter's and the all-reduce's are fp32 */
    void *send, *recv; /* carved from op->work (the all-gather's recv may be out) */
    float *pad;        /* all-reduce: the padded fp32 buffer */
} zr_coll_direct;

_Static_assert(sizeof(zr_coll_direct) <= ZR_COLL_STATE_BYTES, "direct state fits in an op");

/*
 * The reduce-scatter's exchange: carve the buffers from the start of
 * op->work, send in (of the state's in_type) as it is when it is of the
 * wire type, else cast into the send buffer first, and post the all-to-all
 * of the zr_coll_direct state of op, accounted under kind.
 */
zr_status zr_reduce_scatter_direct_post(zr_comm *c, zr_coll_op *op, zr_kind kind, const void *in);

/* After the exchange: out = the mean of the received partitions, summed in rank order. */
zr_status zr_reduce_scatter_direct_finish(zr_comm *c, zr_coll_op *op, float *out);

#endif /* ZR_COLL_DIRECT_H */
