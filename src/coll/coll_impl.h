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

/* The op is complete (also after a failure at start: nothing of it is queued). */
void zr_coll_end(zr_coll_op *op);

/*
 * The algorithm has queued its last step. On the CPU that is the end
 * (zr_coll_end). On a device the op stays in flight until the codec stream
 * has run everything it queued and the received blocks' headers have been
 * validated (coll_local.c); zr_coll_test / zr_coll_wait complete it.
 */
zr_status zr_coll_finish(zr_coll_op *op);

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

/* ---- local work: the CPU or the device ------------------------------------ */

/* A received quantized block to validate, and what its failure message names. */
typedef struct zr_coll_check {
    const char *what; /* "qwZ", "qgZ" */
    zr_group group;
    int peer;            /* in-group rank it came from */
    size_t bytes, count; /* the block's expected size and element count */
    zr_quant_params q;   /* its expected format */
    int add_nonfinite;   /* add its non-finite groups to op->nonfinite */
} zr_coll_check;

typedef struct zr_coll_dev zr_coll_dev; /* an op's device part, kept across its collectives */

/*
 * Everything an algorithm does between its exchanges, as a table chosen per
 * op at zr_coll_begin by where the communicator's data plane lives
 * (zr_comm_device): the CPU functions on host buffers, or kernels queued on
 * the op's codec stream on device buffers (coll_local.c). Every algorithm
 * keeps one schedule for both and calls its local steps through the table,
 * so the CPU and a GPU run the same steps, in the same order, on the same
 * bytes: exact results are the same bits, and so are quantized blocks (the
 * codec's rules are shared, zr/quant_cuda.h). x is the table's context
 * (zr_coll_local_of). On the device every call only queues work.
 *
 * The op core (coll.c) calls the device part's members: the CPU's do
 * nothing (finish says the op is complete at once), the device's keep the
 * op's codec stream (coll_local_cuda.c). Every member is set in both
 * instances of a build with CUDA.
 */
typedef struct zr_coll_local {
    const char *name; /* "cpu", "cuda" */
    zr_status (*copy)(void *x, void *dst, const void *src, size_t bytes);
    zr_status (*zero)(void *x, void *dst, size_t bytes);
    zr_status (*to_bf16)(void *x, zr_bf16 *dst, const float *src, size_t n);
    zr_status (*from_bf16)(void *x, float *dst, const zr_bf16 *src, size_t n);
    /* zr_quant_encode (the non-finite count is read from the header when checked) */
    zr_status (*encode)(void *x, const zr_quant_params *p, zr_dtype in_type, const void *in,
                        size_t n, float mul, float *residual, void *block);
    /* zr_quant_decode into out_type (bf16: the fp32 value rounded, as zr_bf16_from_f32) */
    zr_status (*decode)(void *x, const void *block, zr_dtype out_type, void *out, size_t n);
    zr_status (*decode_add)(void *x, const void *block, float *acc, size_t n);
    zr_status (*sum_requant)(void *x, const void *const *blocks, int k, size_t n, float mul,
                             const zr_quant_params *p, float *residual, void *out_block);
    /* out[i] = ((row_0[i] + row_1[i]) + ... + row_{k-1}[i]) / k, row_j = in + j*stride of
       in_type (fp32, or bf16 widened exactly): the exact reduce-scatter's mean */
    zr_status (*mean)(void *x, float *out, const void *in, zr_dtype in_type, int k, size_t stride,
                      size_t n);
    /* Room for this many checks in the op (before the first; the device copies headers). */
    zr_status (*expect_checks)(void *x, size_t n);
    /* Validate a received block (CPU: now; device: its header, when the op completes). */
    zr_status (*check)(void *x, zr_comm *c, zr_coll_op *op, const void *block,
                       const zr_coll_check *k);
    /* Where an array of pointers the local work reads lives (bytes): the workspace piece
       carved for it (CPU), or the op's host scratch (a device, whose launches take it from
       the host while the workspace is device memory). */
    zr_status (*ptr_array)(zr_coll_op *op, void *carved, size_t bytes, void **out);
    /* hpZ's cut (hpz.c), outside any op: n elements of src into dst, a copy or a bf16 cast,
       queued on the stream the communicator follows (follow; the CPU: at once). */
    zr_status (*cut)(zr_stream *follow, zr_dtype dst_type, void *dst, zr_dtype src_type,
                     const void *src, size_t n);

    /* ---- the device part of an op, for the op core ---- */
    /*
     * A new op on d: *dev (the op's device part: codec stream, events) kept
     * when it already is on d, else (re)created; the codec stream starts
     * after the work queued on follow so far (NULL: legacy stream).
     */
    zr_status (*start)(zr_coll_dev **dev, const zr_device *d, zr_stream *follow);
    /* The op's last step is queued: *done = 1 when it is complete now, 0 when it is polled. */
    zr_status (*finish)(void *x, int *done);
    /* *done = 1 once the queued work has run and the checks passed (block: wait, polling). */
    zr_status (*poll)(zr_comm *c, void *x, zr_coll_op *op, int block, int *done);
    /* After a failure: wait until the queued work has run. */
    void (*drain)(void *x);
    /* Around each exchange: c's exchanges follow the op's work (*prev: what they followed
       before), then prev again. */
    zr_status (*follow)(void *x, zr_comm *c, zr_stream **prev);
    zr_status (*unfollow)(void *x, zr_comm *c, zr_stream *prev);
} zr_coll_local;

extern const zr_coll_local zr_coll_local_cpu;
extern const zr_coll_local zr_coll_local_cuda;

/* Validate a received block (its header: what zr_quant_validate reads) with the CPU's message. */
zr_status zr_coll_check_now(zr_comm *c, zr_coll_op *op, const void *block, const zr_coll_check *k);

/*
 * n elements of src (src_type) into dst (dst_type) through L: a bf16 cast
 * either way, or a copy when the types are the same (nothing when dst is src).
 */
zr_status zr_coll_convert(const zr_coll_local *L, void *x, zr_dtype dst_type, void *dst,
                          zr_dtype src_type, const void *src, size_t n);

/*
 * The local-work table of c's data plane, by where its bytes live (*where:
 * zr_comm_device's GPU, or the CPU), and the stream c follows (*follow).
 */
const zr_coll_local *zr_coll_local_for(const zr_comm *c, zr_device *where, zr_stream **follow);

/* The local-work table of an op begun with zr_coll_begin, and its context in *x. */
const zr_coll_local *zr_coll_local_of(zr_coll_op *op, void **x);

/*
 * Exchanges of an op (zr_comm_iallgather / zr_comm_ialltoall): on a device
 * they follow the op's codec stream, so they start after the local work
 * queued before them, without a host wait.
 */
zr_status zr_coll_iallgather(zr_comm *c, zr_coll_op *op, zr_group g, zr_kind kind, const void *send,
                             size_t bytes, void *recv, zr_request *req);
zr_status zr_coll_ialltoall(zr_comm *c, zr_coll_op *op, zr_group g, zr_kind kind, const void *send,
                            size_t bytes, void *recv, zr_request *req);

/* Host memory of the op kept across calls (pointer arrays for the device's launches). */
zr_status zr_coll_host_scratch(zr_coll_op *op, size_t bytes, void **out);

/* The device part an op kept (zr_coll_local.start), freed with the op (NULL: nothing). */
void zr_coll_dev_free(zr_coll_dev *dev);

/* Wait (block) or test one request; *done = 1 once it is complete. */
zr_status zr_coll_progress(zr_comm *c, zr_request *req, int block, int *done);

/* Non-finite groups recorded in the header of a validated block. */
size_t zr_coll_block_nonfinite(const void *block);

/* Costs (zr_coll_cost): one exchange of bytes to every peer of group g, as hop `hop` of k. */
void zr_coll_cost_send(const zr_comm *c, zr_group g, size_t bytes, int hop, zr_coll_cost *k);

#endif /* ZR_COLL_IMPL_H */
