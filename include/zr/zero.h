/*
 * zr/zero.h - the ZeRO engine: memory-sharded data-parallel training of any
 * model whose parameters come in units (flat buffers: fp32 master weights,
 * working parameters and gradients in the compute type, see "Types").
 *
 * The sharding plan says, for parameters, gradients and optimizer state,
 * whether each is replicated or sharded over the world; the ZeRO stages are
 * presets of it, and hpZ adds a secondary copy of the parameters sharded over
 * the hpZ group:
 *
 *              params      grads       optimizer (fp32 master, Adam m, v)
 *   stage 0    replicated  replicated  replicated   (plain data parallel: all-reduce)
 *   stage 1    replicated  replicated  world        (reduce-scatter at the step)
 *   stage 2    replicated  world       world        (reduce-scatter as each unit finishes)
 *   stage 3    world       world       world        (gather before use, release after)
 *   + hpZ      secondary copy over the hpZ group, cut from the first forward gather
 *
 * Every unit's buffer is padded with zeros to a multiple of W * ZR_ZERO_PAD
 * elements and split into W equal shards; rank r owns [r*S, (r+1)*S).
 *
 * The caller drives the model, unit by unit, and tells the engine what it
 * needs (the same calls in the same order on every rank; tests/test_zero.c
 * test_usage_sketch runs exactly this):
 *
 *   const void *p;                                  zr_engine_param_type elements
 *   void *g;                                        zr_engine_grad_type elements
 *   zr_step_stats stats;
 *   ZR_CHECK(zr_engine_micro_begin(e));             once per micro-batch
 *   for (int u = 0; u < nunits; u++) {              forward
 *       ZR_CHECK(zr_engine_prefetch(e, u, ZR_PHASE_FORWARD));  optional: gather early
 *       ZR_CHECK(zr_engine_fetch(e, u, ZR_PHASE_FORWARD, &p)); full parameters of unit u
 *       ... forward of unit u ...
 *       ZR_CHECK(zr_engine_release(e, u));          done with unit u's parameters
 *   }
 *   for (int u = nunits - 1; u >= 0; u--) {         backward
 *       ZR_CHECK(zr_engine_fetch(e, u, ZR_PHASE_BACKWARD, &p));
 *       ZR_CHECK(zr_engine_grads(e, u, &g));        unit u's full gradient buffer
 *       ... backward of unit u, accumulating into g ...
 *       ZR_CHECK(zr_engine_release(e, u));
 *       ZR_CHECK(zr_engine_grads_done(e, u));       complete for this micro-batch
 *   }
 *   ZR_CHECK(zr_engine_step(e, lr, &stats));        after the last micro-batch
 *
 * The hpZ decision (gather from the primary shards over the world, or from
 * the secondary over the hpZ group) depends only on engine state that every
 * rank updates identically: a secondary is valid from the release that cut
 * it until the next optimizer step or load. With ZR_SAFE=1 in the
 * environment, ranks compare each decision before gathering and fail loudly
 * on a divergence instead of hanging.
 *
 * Types. The fp32 master weights and Adam moments are what the optimizer
 * updates; the model computes on working copies in the compute type
 * (zr_engine_config.work_type), as DeepSpeed does in bf16: with ZR_DTYPE_BF16
 * the gathered units (stage 3), the replicated working copy (stages 1-2) and
 * the gradient buffer of a micro-batch (stages 2-3, reduced as soon as its
 * backward is done) are bf16, half the bytes of the pool and of the stage 1-2
 * state. What stays fp32 whatever the work type: the master weights and
 * moments; the gradient shard that accumulates the micro-batches and the
 * reduction's output; stage 0-1's replicated gradients, which accumulate the
 * micro-batches themselves (bf16 sums would lose them); stage 0's working
 * copy, which is the master. zr_engine_param_type and zr_engine_grad_type say
 * what a configuration hands out. A bf16 working value is always the bf16
 * rounding of the fp32 one the same engine would hold with ZR_DTYPE_F32, and
 * every sum is fp32 in the same order (src/coll): a bf16 engine trains, bit
 * for bit, the trajectory of an fp32 engine whose caller rounds what it reads
 * and the gradient sums it keeps to bf16 (tests/test_zero.c). The CPU engine
 * can hold bf16 buffers too; the CPU model computes in fp32 only.
 *
 * Dry runs. An engine made by zr_engine_init_dry runs the same code over a
 * layout only (zr_comm_init_layout: who is where, no MPI): the same budgets,
 * reduction queue, hpZ life cycle, pool (sizes tracked, payloads not held)
 * and workspaces, but no data and no collective. Where a real engine starts
 * a collective, waits for one or works on the CPU, a dry one tells its
 * observer, with what src/coll says the collective will send and convert
 * (zr_coll_cost). Driving it with the same calls as a real run (for the GPT:
 * zr_gpt_engine_walk) walks that run's schedule; the planner costs it.
 */
#ifndef ZR_ZERO_H
#define ZR_ZERO_H

#include "zr/coll.h"
#include "zr/comm.h"

/* Shards are multiples of this many elements (64 bytes of fp32: aligned). */
#define ZR_ZERO_PAD 16

/*
 * Elements of a unit of numel elements once padded for W ranks: a multiple of
 * W * ZR_ZERO_PAD, at least one element so that every rank owns a shard. The
 * engine lays its buffers out by this rule and checkpoints find the slices in
 * their rank files by it, so it exists once.
 */
static inline size_t zr_zero_padded(size_t numel, int world)
{
    return zr_round_up(numel == 0 ? 1 : numel, (size_t)world * ZR_ZERO_PAD);
}

/* Where a piece of training state lives. */
typedef enum zr_placement {
    ZR_REPLICATED = 0, /* full copy on every rank */
    ZR_SHARDED = 1,    /* 1/W on each rank */
} zr_placement;

typedef struct zr_zero_plan {
    int stage;           /* 0..3: the preset this plan came from */
    zr_placement params; /* working parameters */
    zr_placement grads;  /* gradients */
    zr_placement optim;  /* fp32 master weights and Adam moments */
    int secondary;       /* 1: hpZ secondary copy of the parameters over ZR_GROUP_HPZ */
} zr_zero_plan;

/* The preset for a ZeRO stage, with or without hpZ. */
zr_zero_plan zr_zero_plan_preset(int stage, int hpz);

/* A range of a unit that gets weight decay or not (LayerNorm and biases do not). */
typedef struct zr_range {
    size_t offset, numel;
    int decay;
} zr_range;

/* What the engine needs to know about one unit of parameters. */
typedef struct zr_unit_spec {
    size_t numel;           /* elements before padding */
    int nranges;            /* ranges covering [0, numel) */
    const zr_range *ranges; /* owned by the caller, must outlive the engine */
} zr_unit_spec;

typedef enum zr_phase {
    ZR_PHASE_FORWARD = 0,
    ZR_PHASE_BACKWARD = 1,
} zr_phase;

typedef struct zr_engine_config {
    int stage;             /* 0..3 */
    zr_wire param_wire;    /* exact parameter gathers: ZR_WIRE_BF16 (default) or ZR_WIRE_F32 */
    zr_wire grad_wire;     /* exact gradient reductions: ZR_WIRE_BF16 or ZR_WIRE_F32 */
    int qwz;               /* quantize weight gathers (stage 3) */
    zr_quant_params qwz_q; /* INT8, group from quant.h by default */
    int hpz;               /* hpZ secondary partition (stage 3) */
    int qgz;               /* quantized hierarchical gradient reduce-scatter (stage 2, 3) */
    zr_qgz_config qgz_cfg; /* INT4 by default */
    int overlap;           /* overlap communication with compute (prefetch, async reduction) */
    size_t
        max_live; /* stage 3: elements of gathered parameters allowed at once (prefetch budget) */
    size_t
        prefetch_bucket; /* stage 3: elements that may be in flight ahead of use; 0 = no prefetch */
    size_t
        reduce_bucket; /* elements of gradient reductions in flight (>= 1; one unit always may) */
    float beta1, beta2, eps, weight_decay; /* AdamW */
    float grad_clip;                       /* global grad-norm clipping; <= 0 disables */
    zr_dtype work_type; /* working parameters and gradients: ZR_DTYPE_F32 or BF16 ("Types") */
} zr_engine_config;

/*
 * Defaults: stage 3, bf16 wire, ZeRO++ off, overlap on, AdamW(0.9, 0.95,
 * 1e-8, 0.1), clip 1.0, fp32 working buffers.
 */
zr_engine_config zr_engine_config_default(void);

/* The element type of the buffers zr_engine_fetch / zr_engine_grads hand out under cfg. */
zr_dtype zr_engine_param_type(const zr_engine_config *cfg);
zr_dtype zr_engine_grad_type(const zr_engine_config *cfg);

/* Per-step accounting, filled by zr_engine_step. */
typedef struct zr_step_stats {
    double grad_norm;           /* before clipping; NaN/Inf if non-finite */
    int skipped;                /* 1 if the step was skipped (non-finite gradients) */
    double t_comm;              /* exposed communication: seconds the host (a device engine:
                                   the GPU's stream) sat waiting for collectives */
    double t_optim;             /* seconds in the optimizer step and parameter refresh */
    double t_total;             /* seconds from the first micro_begin to the end of the step */
    zr_traffic traffic;         /* this rank's bytes and calls during the step */
    size_t live_peak;           /* peak elements of gathered parameters during the step */
    uint64_t zero3_bytes_inter; /* what ZeRO-3 with bf16 on the wire would have sent across
                                   nodes from this rank for the same gathers and reductions */
} zr_step_stats;

/* ---- dry runs --------------------------------------------------------------- */

typedef enum zr_engine_event_type {
    ZR_ENGINE_POST,    /* a collective starts on op; cost says what it sends and converts */
    ZR_ENGINE_WAIT,    /* the engine blocks until the collective on op is complete */
    ZR_ENGINE_WORK,    /* CPU work of the engine itself: work, elements */
    ZR_ENGINE_COMPUTE, /* the caller computes unit (phase): zr_engine_note_compute */
} zr_engine_event_type;

typedef enum zr_engine_work {
    ZR_WORK_HPZ_CUT,   /* a secondary cut from a gathered unit of another type (conversions) */
    ZR_WORK_GRAD_ZERO, /* a pooled gradient buffer (work type) zeroed for the backward */
    ZR_WORK_GRAD_FOLD, /* a reduced gradient added into its shard (fp32 adds) */
    ZR_WORK_NORM,      /* the step's sum of squares for the gradient norm */
    ZR_WORK_ADAMW,     /* AdamW updates of this rank's slice */
    ZR_WORK_CLEAR,     /* accumulated gradients cleared after the step */
} zr_engine_work;

typedef struct zr_engine_event {
    zr_engine_event_type type;
    const void *op;      /* POST, WAIT: the collective (an op is reused after its wait) */
    zr_coll_cost cost;   /* POST */
    zr_engine_work work; /* WORK */
    size_t elements;     /* WORK */
    int unit;            /* COMPUTE */
    zr_phase phase;      /* COMPUTE */
} zr_engine_event;

typedef struct zr_engine_observer {
    void (*event)(void *ctx, const zr_engine_event *ev);
    void *ctx;
} zr_engine_observer;

typedef struct zr_unit_state zr_unit_state;         /* private to the engine */
typedef struct zr_engine_pool zr_engine_pool;       /* private: reused transient buffers and ops */
typedef struct zr_engine_bufs zr_engine_bufs;       /* private: the engine's buffer operations */
typedef struct zr_engine_scratch zr_engine_scratch; /* private: a device engine's step scratch */

typedef struct zr_engine {
    zr_comm *comm; /* not owned */
    zr_engine_config cfg;
    zr_zero_plan plan;
    int nunits;
    zr_unit_state *units; /* owned */
    zr_engine_pool *pool; /* owned */
    int *fifo;            /* owned; units whose reduction is in flight, oldest at fifo_head */
    int fifo_head, nreducing;
    size_t reducing;        /* padded elements of the reductions in flight */
    int step;               /* optimizer steps taken (AdamW's t) */
    int micro;              /* micro-batches since the last step */
    int safe;               /* ZR_SAFE=1: cross-check hpZ decisions */
    size_t live, live_peak; /* gathered parameter elements now / peak this step */
    size_t prefetched;      /* elements of gathers started ahead of use, not yet waited on */
    double t_comm, t_optim, t_begin;
    zr_traffic traffic_begin;
    uint64_t zero3_inter;       /* the ZeRO-3 bf16 shadow count of this step */
    zr_engine_observer dry;     /* dry runs: where events go; event == NULL: a real engine */
    int on_device;              /* the state is in device memory (see "Where the state lives") */
    zr_device device;           /* that GPU, or the CPU */
    const zr_engine_bufs *bufs; /* where its buffer work runs: host, device or dry */
    zr_engine_scratch *scratch; /* owned by bufs' device instance; on_device only */
} zr_engine;

/*
 * Build the plan and allocate the engine's state for nunits units. Collective;
 * an invalid configuration fails on every rank with the same message.
 *
 * Where the state lives: where the communicator's data plane moves bytes
 * (zr_comm_device at init). With the MPI transport, host memory, as always.
 * With a device transport (zr_transport_nccl, zr_transport_staged), the
 * memory of its GPU: parameters, gradients, optimizer shards, hpZ
 * secondaries and the pool; the engine's own work (zeroing, folding reduced
 * gradients, the gradient norm, AdamW, refreshes) runs as kernels queued on
 * the stream the communicator follows, which must then be set
 * (zr_comm_device_follow) and be the caller's compute stream: fetch and
 * grads hand out device pointers, valid for work queued on that stream, and
 * the collectives start after what the caller queued there. The host waits
 * for the device once per step (the gradient norm) and where it reads
 * (zr_engine_get_params, zr_engine_optim_read). Results are the host
 * engine's bits, except the gradient norm's order of addition.
 */
zr_status zr_engine_init(zr_engine *e, zr_comm *comm, const zr_engine_config *cfg, int nunits,
                         const zr_unit_spec *units);
void zr_engine_free(zr_engine *e);

/*
 * A dry engine (see "Dry runs" above) over layout, which it reads and never
 * sends on; events go to obs. Not collective. The life-cycle calls, the
 * step and zr_engine_memory work as on a real engine (fetch and grads hand
 * out tokens that must not be read or written); zr_engine_set_params takes
 * a NULL buffer; reading or loading parameters is refused.
 */
zr_status zr_engine_init_dry(zr_engine *e, zr_comm *layout, const zr_engine_config *cfg, int nunits,
                             const zr_unit_spec *units, zr_engine_observer obs);

/* Tell a dry engine's observer that the caller computes unit u now; no-op on a real engine. */
void zr_engine_note_compute(zr_engine *e, int u, zr_phase phase);

/*
 * Set unit u's parameters from a full buffer (numel elements, identical on
 * every rank): the engine keeps what its plan says this rank holds. Also
 * resets Adam's moments for that unit and invalidates its secondary.
 */
zr_status zr_engine_set_params(zr_engine *e, int u, const float *full);

/* Gather unit u's exact fp32 parameters (master weights) into full (numel elements). Collective. */
zr_status zr_engine_get_params(zr_engine *e, int u, float *full);

zr_status zr_engine_micro_begin(zr_engine *e);
zr_status zr_engine_prefetch(zr_engine *e, int u, zr_phase phase);
/* Unit u's padded working parameters, zr_engine_param_type elements, valid until the release. */
zr_status zr_engine_fetch(zr_engine *e, int u, zr_phase phase, const void **params);
zr_status zr_engine_release(zr_engine *e, int u);
/*
 * Unit u's padded gradient buffer, zr_engine_grad_type elements, for the
 * backward to accumulate into (+=): zeroed at the first call of a micro-batch
 * (sharded gradients) or of a step (replicated ones), valid until
 * zr_engine_grads_done.
 */
zr_status zr_engine_grads(zr_engine *e, int u, void **grads);
zr_status zr_engine_grads_done(zr_engine *e, int u);

/*
 * Finish the step: complete gradient reductions, compute the global grad
 * norm, skip the step on every rank if it is not finite, clip, run AdamW
 * with learning rate lr on this rank's optimizer shards and refresh the
 * working parameters; invalidate hpZ secondaries.
 */
zr_status zr_engine_step(zr_engine *e, float lr, zr_step_stats *stats);

/* Invalidate every hpZ secondary (after a load or any write to parameters). */
void zr_engine_invalidate_secondary(zr_engine *e);

/*
 * Bytes this rank holds now: model state (params, grads, optimizer,
 * secondaries), gathered parameters (stage 3), and the engine's pool of
 * transient buffers (gathered units, gradients being reduced and their
 * staging, collective workspaces; gathered is part of it) now and at its
 * peak since zr_engine_init.
 */
typedef struct zr_memory {
    size_t params, grads, optim, secondary, gathered;
    size_t pool, pool_peak;
} zr_memory;
zr_memory zr_engine_memory(const zr_engine *e);

/*
 * Memory an engine with this configuration would hold on each rank, known
 * before anything is allocated (collective-free; comm gives the layout):
 * state = the model state zr_engine_memory reports after init; pool = an
 * upper bound of the engine's pool (zr_memory.pool_peak) when the caller
 * holds at most `held` units gathered, or their gradients, at once and
 * prefetches at most `ahead` units ahead of use, besides what the budgets let
 * the engine keep (prefetches and reductions in flight).
 */
typedef struct zr_memory_plan {
    size_t state, pool;
} zr_memory_plan;
zr_memory_plan zr_engine_plan_memory(const zr_engine_config *cfg, const zr_comm *comm, int nunits,
                                     const zr_unit_spec *units, int held, int ahead);

/* Sizes of the padded layout. */
size_t zr_engine_numel(const zr_engine *e, int u);  /* elements of unit u before padding */
size_t zr_engine_padded(const zr_engine *e, int u); /* padded elements of unit u */
size_t zr_engine_shard(const zr_engine *e, int u);  /* elements of one shard of unit u */

/*
 * This rank's optimizer shard of unit u (the slice [r*S, (r+1)*S) of the
 * padded unit, S = zr_engine_shard) of one of the three optimizer arrays,
 * for checkpoints: elements [offset, offset + count) of the slice copied to
 * or from host memory, wherever the engine keeps its state (a device
 * engine's copies are complete when the call returns). With a replicated
 * optimizer the slice is cut from the full state, so checkpoints look the
 * same at every stage.
 */
typedef enum zr_optim_array {
    ZR_OPTIM_MASTER = 0, /* fp32 master weights */
    ZR_OPTIM_M = 1,      /* Adam's first moment */
    ZR_OPTIM_V = 2,      /* Adam's second moment */
} zr_optim_array;
zr_status zr_engine_optim_read(zr_engine *e, int u, zr_optim_array which, size_t offset,
                               size_t count, float *host);
zr_status zr_engine_optim_write(zr_engine *e, int u, zr_optim_array which, size_t offset,
                                size_t count, const float *host);

/*
 * qgZ's error-feedback residuals of unit u (zr.quant.qgz_error_feedback),
 * for checkpoints: hop 0 is the first quantization's (W*S elements), hop 1
 * the requantization's (N*S). count: how many the engine holds (0 before
 * the first reduction, and without feedback); read and write copy elements
 * [offset, offset + count) to or from host memory; a write into a hop whose
 * count is not total first (re)allocates it with total elements where qgZ
 * keeps them, so that qgZ's next reduction continues from what was written.
 */
size_t zr_engine_feedback_count(const zr_engine *e, int u, int hop);
zr_status zr_engine_feedback_read(zr_engine *e, int u, int hop, size_t offset, size_t count,
                                  float *host);
zr_status zr_engine_feedback_write(zr_engine *e, int u, int hop, size_t total, size_t offset,
                                   size_t count, const float *host);

/* After writing optimizer shards (checkpoint load): rebuild working params. Collective. */
zr_status zr_engine_sync_from_shards(zr_engine *e);

#endif /* ZR_ZERO_H */
