/*
 * zr/coll.h - the collectives of ZeRO and ZeRO++ over a zr_comm.
 *
 *   exact all-gather / reduce-scatter / all-reduce   what "ZeRO-3" means in
 *       every comparison: fp32 or bf16 on the wire, fp32 accumulation (MPI has
 *       no bf16 sum, so zr owns the reduction), divide by the group size once.
 *   qwZ  quantized all-gather: each rank quantizes its shard (INT8 default),
 *       one packed block per rank (header + scales + payload), dequantized
 *       into the full buffer (fp32 or bf16). Any group (world, or hpZ).
 *   hpZ  the secondary partition: a rank keeps slice k of a full buffer,
 *       k = its rank in ZR_GROUP_HPZ; the full buffer is rebuilt later by an
 *       all-gather over ZR_GROUP_HPZ (exact or quantized), accounted as HPZ.
 *   qgZ  hierarchical quantized reduce-scatter: INT4 intra-node all-to-all,
 *       dequantize-sum-requantize, INT4 inter-node all-to-all, final
 *       dequantize-sum; rank r ends with the average of partition r.
 *
 * Every collective is nonblocking: *_start posts it and returns, zr_coll_test
 * progresses it, zr_coll_wait completes it. A zr_coll_op owns the workspace
 * of one collective and keeps it across calls (grown when needed, freed by
 * zr_coll_op_free), so a training step allocates nothing once warm.
 *
 * Ordering: ops are matched across ranks in start order, so every rank must
 * start the same collectives in the same order (as with MPI). An op that
 * would post on a group where an earlier op still has a phase to post waits
 * its turn: its *_start then returns before posting and zr_coll_test /
 * zr_coll_wait post it (wait completes the earlier op first). Inputs and
 * outputs must stay valid and untouched until the op completes.
 *
 * Buffers: "count" is elements per rank's partition; full buffers hold
 * size[g] * count elements, partition p at offset p * count. Callers pad
 * their buffers so that they divide evenly (zero padding).
 *
 * Types. Inputs and outputs are fp32 or bf16 (zr_dtype) wherever a caller
 * keeps either: the ZeRO engine's working parameters and gradients are bf16
 * in bf16 compute, its master weights and gradient shards fp32. The type of
 * a buffer never changes a result beyond rounding it: a bf16 output is the
 * fp32 output's value rounded to bf16 (round to nearest even), a bf16 input
 * is read exactly; every sum stays fp32 in rank order. A conversion happens
 * once, where the types differ (wire against input, wire against output);
 * bf16 on the wire into a bf16 output is received in place, never widened.
 *
 * Device buffers. On a communicator whose transport is a device one
 * (zr_comm_device != NULL), every collective here takes device buffers of
 * that GPU (in, out, secondaries; qgZ's residuals are then device memory
 * too) and runs its local work as kernels on a codec stream of its op, after
 * the work queued on the stream the communicator follows when it starts;
 * once zr_coll_test / zr_coll_wait say it is complete, its output is in
 * place for work queued afterwards on any stream. The results are the CPU
 * path's bits on the same inputs, and the traffic counters count the same
 * bytes (src/coll/coll_local.c).
 */
#ifndef ZR_COLL_H
#define ZR_COLL_H

#include "zr/comm.h"
#include "zr/quant.h"

/* What goes on the wire. */
typedef enum zr_wire_type {
    ZR_WIRE_F32 = 0, /* exact */
    ZR_WIRE_BF16,    /* 16-bit: the ZeRO-3 baseline of the paper */
    ZR_WIRE_QUANT,   /* block-quantized with q */
} zr_wire_type;

typedef struct zr_wire {
    zr_wire_type type;
    zr_quant_params q; /* used when type == ZR_WIRE_QUANT */
} zr_wire;

/* One in-flight collective and its reusable workspace (opaque to callers). */
typedef struct zr_coll_op {
    int active;
    int phase; /* multi-hop collectives advance through phases */
    zr_request req[4];
    void *work; /* owned workspace, reused across calls */
    size_t work_cap;
    void *impl;       /* the op core's state and the running algorithm's, owned */
    size_t nonfinite; /* non-finite quantization groups seen (qwZ/qgZ) */
} zr_coll_op;

#define ZR_COLL_OP_INIT                                                                            \
    {                                                                                              \
        0                                                                                          \
    }

void zr_coll_op_free(zr_coll_op *op);

/* Complete a collective (no-op if none in flight). */
zr_status zr_coll_wait(zr_comm *c, zr_coll_op *op);

/* Progress without blocking; *done = 1 once complete. */
zr_status zr_coll_test(zr_comm *c, zr_coll_op *op, int *done);

/*
 * All-gather over group g: every rank contributes count elements of in
 * (type in_type), out receives size[g]*count elements of out_type (fp32 or
 * bf16 each). wire: F32, BF16 (exact baselines) or QUANT (qwZ, decoded
 * straight into out_type). kind names the traffic row (ZR_KIND_ALLGATHER,
 * ZR_KIND_QWZ, ZR_KIND_HPZ). in may be my own slot of out (in place) when
 * in_type is out_type.
 */
zr_status zr_allgather_start(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire,
                             zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                             void *out, zr_coll_op *op);

/*
 * Reduce-scatter (average) over group g: in holds size[g]*count elements of
 * in_type (fp32 or bf16), out receives count fp32 = the mean over ranks of
 * partition rank[g]. wire F32 or BF16; accumulation in fp32 in rank order
 * (every rank computes its partition with the same order, so results are
 * deterministic). The output stays fp32: it is what a gradient shard
 * accumulates.
 */
zr_status zr_reduce_scatter_start(zr_comm *c, zr_group g, const zr_wire *wire, zr_dtype in_type,
                                  const void *in, size_t count, float *out, zr_coll_op *op);

/*
 * All-reduce (average) in place over group g: buf holds count fp32 elements
 * (any count). fp32 only: its one user, stage 0, reduces gradients that
 * accumulate over micro-batches, and those stay fp32 in every compute type.
 */
zr_status zr_allreduce_start(zr_comm *c, zr_group g, const zr_wire *wire, float *buf, size_t count,
                             zr_coll_op *op);

/*
 * hpZ: copy my slice of a full buffer (size[HPZ]*count elements of
 * full_type) into secondary (count elements of type); fp32 or bf16 each.
 */
zr_status zr_hpz_cut(const zr_comm *c, zr_dtype full_type, const void *full, size_t count,
                     zr_dtype type, void *secondary);

/*
 * hpZ: rebuild full (size[HPZ]*count elements of out_type) from the
 * secondaries of my hpZ group: exactly zr_allgather_start(c, ZR_GROUP_HPZ,
 * ZR_KIND_HPZ, wire, type, secondary, count, out_type, full, op).
 */
zr_status zr_hpz_gather_start(zr_comm *c, const zr_wire *wire, zr_dtype type, const void *secondary,
                              size_t count, zr_dtype out_type, void *full, zr_coll_op *op);

/* ---- qgZ ------------------------------------------------------------------ */

typedef struct zr_qgz_config {
    zr_quant_params q; /* both hops; INT4 by default */
    int chunks; /* pipelining: >1 splits the buffer so hop 1 of chunk k+1 overlaps hop 2 of chunk k
                 */
    int error_feedback; /* keep quantization residuals per buffer (see zr_qgz_feedback) */
} zr_qgz_config;

/* Error-feedback state for one gradient buffer (caller-owned, one per unit). */
typedef struct zr_qgz_feedback {
    float *intra; /* residual of the first quantization, W*count elements (owned) */
    float *inter; /* residual of the requantization, count*N... (owned; sized by qgZ) */
    size_t n_intra, n_inter;
    zr_device dev; /* where intra and inter live: the communicator's data plane (set by qgZ) */
} zr_qgz_feedback;

void zr_qgz_feedback_free(zr_qgz_feedback *fb);

/* INT4 symmetric, ZR_QUANT_DEFAULT_GROUP, one chunk, no error feedback (what cfg = NULL means). */
zr_qgz_config zr_qgz_config_default(void);

/*
 * qgZ over the world: in holds W*count elements (type in_type, fp32 or bf16),
 * out receives count fp32 = the average over all ranks of partition
 * rank[WORLD]. Works for any node count (1, 2, 3, ...) and any count
 * (quantization groups are padded internally, never a silent fallback).
 * fb may be NULL (no error feedback) and is used only if cfg->error_feedback;
 * its buffers are (re)allocated zeroed by qgZ when their size does not fit
 * this call (intra: W*count, inter: N*count when there are both node peers
 * and other nodes) and freed by zr_qgz_feedback_free. cfg may be NULL
 * (zr_qgz_config_default). The average divides by W once, at the first
 * quantization (mul = 1/W). A hop whose group has one member is skipped with
 * its quantization; W = 1 copies in to out exactly. chunks > 1 is
 * bit-identical to chunks = 1 (chunks end on quantization-group boundaries).
 * in and out must stay untouched until the op completes (chunks are
 * quantized as the pipeline advances).
 */
zr_status zr_qgz_start(zr_comm *c, const zr_qgz_config *cfg, zr_dtype in_type, const void *in,
                       size_t count, float *out, zr_qgz_feedback *fb, zr_coll_op *op);

/*
 * What one rank does in one collective, known from the layout of c alone,
 * before (or instead of) running it: dry runs of the engine and the planner
 * read it. The exchanges it posts and the bytes it sends to peers on its own
 * node and on other nodes are exactly what zr_comm_iexchange will account;
 * bytes are split by hop (hop 1 starts only once hop 0 has arrived: the
 * all-reduce's gather, qgZ's cross-node all-to-all). The element counts are
 * the CPU work the algorithm does around the exchanges, and work is the
 * bytes of workspace it reserves in its op (zr_coll_op.work_cap grows to it
 * and keeps it).
 */
typedef struct zr_coll_cost {
    zr_kind kind;                /* the traffic row it is accounted under */
    uint64_t exchanges;          /* zr_comm_iexchange calls (the row's calls) */
    uint64_t intra[2], inter[2]; /* bytes sent to peers on my node / other nodes, per hop */
    uint64_t intra_msgs[2], inter_msgs[2]; /* ... in that many messages (one per peer and send) */
    size_t bf16_enc, bf16_dec;             /* elements converted fp32 -> bf16, bf16 -> fp32 */
    size_t f32_add;                        /* elements summed in fp32 */
    size_t q_enc, q_dec; /* elements quantized; dequantized (or dequantized and added) */
    int q_bits;          /* the quantization's bits, when q_enc or q_dec */
    size_t work;         /* workspace bytes */
} zr_coll_cost;

/*
 * The cost of the collective the same arguments to its *_start would run
 * (qgZ's does not depend on its input type: the encoder reads bf16 as it
 * reads fp32, no conversion between).
 */
zr_coll_cost zr_allgather_cost(const zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire,
                               zr_dtype in_type, size_t count, zr_dtype out_type);
zr_coll_cost zr_reduce_scatter_cost(const zr_comm *c, zr_group g, const zr_wire *wire,
                                    zr_dtype in_type, size_t count);
zr_coll_cost zr_allreduce_cost(const zr_comm *c, zr_group g, zr_wire_type wire, size_t count);
zr_coll_cost zr_qgz_cost(const zr_comm *c, const zr_qgz_config *cfg, size_t count);

/* Blocking conveniences: start + wait. */
zr_status zr_allgather(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire, zr_dtype in_type,
                       const void *in, size_t count, zr_dtype out_type, void *out, zr_coll_op *op);
zr_status zr_reduce_scatter(zr_comm *c, zr_group g, const zr_wire *wire, zr_dtype in_type,
                            const void *in, size_t count, float *out, zr_coll_op *op);
zr_status zr_allreduce(zr_comm *c, zr_group g, const zr_wire *wire, float *buf, size_t count,
                       zr_coll_op *op);
zr_status zr_qgz(zr_comm *c, const zr_qgz_config *cfg, zr_dtype in_type, const void *in,
                 size_t count, float *out, zr_qgz_feedback *fb, zr_coll_op *op);
zr_status zr_hpz_gather(zr_comm *c, const zr_wire *wire, zr_dtype type, const void *secondary,
                        size_t count, zr_dtype out_type, void *full, zr_coll_op *op);

#endif /* ZR_COLL_H */
