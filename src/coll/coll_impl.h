/*
 * coll_impl.h - the op core every algorithm file of src/coll is built on:
 * the life of an op, the posting gate, workspace carving. It knows no
 * algorithm by name: an algorithm registers its step function with the op
 * (zr_coll_algo) and keeps its own state in storage the op provides.
 *
 * Life of an op: an algorithm's *_start checks its arguments, calls
 * zr_coll_begin with its zr_coll_algo (which allocates the op's state on
 * first use, zeroes the algorithm's part and registers the op), fills in
 * its state and calls zr_coll_kick, which runs the algorithm's advance
 * once without blocking: that posts the first exchange. zr_coll_test /
 * zr_coll_wait run advance again until the op reaches its end
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
 *
 * Other internal headers: coll_algo.h (the algorithms' entry points, for
 * the public dispatchers in coll_dispatch.c) and coll_direct.h (the state
 * the exact algorithms share).
 */
#ifndef ZR_COLL_IMPL_H
#define ZR_COLL_IMPL_H

#include "zr/coll.h"

/*
 * An algorithm as the op core sees it, registered by the algorithm's *_start.
 * advance(c, op, block): block = 0 does whatever needs no waiting (posts,
 * local work on completed exchanges) and returns; block = 1 does not return
 * before the op is complete. It ends the op with zr_coll_end; a failure it
 * returns ends the op through zr_coll_fail.
 */
typedef struct zr_coll_algo {
    const char *name; /* "qgz", ... for debug logs */
    zr_status (*advance)(zr_comm *c, zr_coll_op *op, int block);
} zr_coll_algo;

/* Bytes of per-op state an algorithm may keep (zr_coll_algo_state); each checks its fit. */
#define ZR_COLL_STATE_BYTES 512

#define ZR_COLL_BIT(g) (1u << (unsigned)(g))

/*
 * Begin an op running algo: fails if it is in flight; registers it for the
 * groups in pending; *state = the algorithm's state, zeroed.
 */
zr_status zr_coll_begin(zr_comm *c, zr_coll_op *op, const zr_coll_algo *algo, unsigned pending,
                        void **state);

/* The algorithm's state of an op begun with zr_coll_begin (ZR_COLL_STATE_BYTES, aligned). */
void *zr_coll_algo_state(zr_coll_op *op);

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

/* Costs (zr_coll_cost): one exchange of bytes to every peer of group g, as hop `hop` of k. */
void zr_coll_cost_send(const zr_comm *c, zr_group g, size_t bytes, int hop, zr_coll_cost *k);

#endif /* ZR_COLL_IMPL_H */
