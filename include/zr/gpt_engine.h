/*
 * zr/gpt_engine.h - the GPT model driven through the ZeRO engine: unit specs
 * for the sharding plan, parameter initialisation, and one micro-batch of
 * forward and backward with the gather / prefetch / release / reduce
 * schedule of ZeRO-3.
 *
 * Schedule of one micro-batch (L blocks, unit L+1 = final LayerNorm, whose
 * LM head reads unit 0's wte):
 *
 *   forward    fetch 0 | fetch 1 ... fetch L | fetch L+1 and 0 again
 *              (while unit u computes, unit u+1 is prefetched; each unit is
 *              released right after its forward, except L+1 and 0 at the end)
 *   backward   L+1 (with 0) -> release both, reduce L+1's gradient
 *              L ... 1      -> fetch (hpZ: from the secondary), prefetch the
 *                              next, backward, release, reduce
 *              0            -> embedding backward needs no parameters; reduce
 *
 * Gradient reduction of unit u starts as soon as its backward is done and
 * overlaps the backward of unit u-1.
 */
#ifndef ZR_GPT_ENGINE_H
#define ZR_GPT_ENGINE_H

#include "zr/model.h"
#include "zr/model_cuda.h"
#include "zr/zero.h"

/* Unit specs of a GPT config, with weight-decay ranges from its tensor table. */
typedef struct zr_gpt_specs {
    int nunits;
    zr_unit_spec *units; /* owned */
    zr_range *ranges;    /* owned; units[u].ranges point in here */
} zr_gpt_specs;

zr_status zr_gpt_specs_init(zr_gpt_specs *s, const zr_gpt_config *cfg);
void zr_gpt_specs_free(zr_gpt_specs *s);

/* GPT-2 initialisation of every unit from seed (identical on every rank, no communication). */
zr_status zr_gpt_engine_init_params(zr_engine *e, const zr_gpt *m, uint64_t seed);

/*
 * Parameters from an llm.c model file of m's shape (zr train --init), read
 * one unit at a time so that no rank ever holds the whole model.
 */
zr_status zr_gpt_engine_load_llmc(zr_engine *e, const zr_gpt *m, const char *path);

/*
 * One micro-batch (B x T tokens of this rank): forward, backward, gradient
 * reductions started. *loss = this rank's mean loss. Call zr_engine_step
 * after the last micro-batch of a step.
 */
zr_status zr_gpt_engine_micro(zr_gpt *m, zr_engine *e, const int *inputs, const int *targets,
                              float *loss);

/*
 * The same micro-batch walked on a dry engine (zr_engine_init_dry over the
 * GPT's unit specs), with no model: the engine reports every collective and
 * its own work, and each unit's forward and backward is reported in place
 * of the computation (zr_engine_note_compute), in the order the real
 * micro-batch runs them.
 */
zr_status zr_gpt_engine_walk(zr_engine *e);

/*
 * What one rank of GPT training holds at its peak, predicted before any of it
 * is allocated: the engine's model state, the model's activations, a bound
 * of the engine's pool for this schedule (which holds at most
 * ZR_GPT_HELD_UNITS units gathered, and gradients, at once and prefetches one
 * unit ahead), and a fixed
 * allowance for the program, MPI and OpenBLAS. bench/memory/README.md
 * compares it with the OS's count.
 */
#define ZR_GPT_HELD_UNITS 3
#define ZR_MEM_ALLOWANCE  ((size_t)64 << 20)
typedef struct zr_gpt_memory_prediction {
    size_t state, activations, pool, allowance, total;
} zr_gpt_memory_prediction;
zr_status zr_gpt_engine_predict(const zr_gpt_config *cfg, int B, int T, int recompute,
                                const zr_engine_config *ecfg, const zr_comm *comm,
                                zr_gpt_memory_prediction *out);

/* Forward only (evaluation): *loss = this rank's mean loss. */
zr_status zr_gpt_engine_eval(zr_gpt *m, zr_engine *e, const int *inputs, const int *targets,
                             float *loss);

/* ---- the GPT on a GPU (gpt_engine_gpu.c) ------------------------------------------- */

/*
 * The device model (zr/model_cuda.h) driven by an engine whose state is on
 * the same GPU (zr_engine_init over a communicator with a device transport
 * that follows this struct's stream: zr/zero.h, "Where the state lives"),
 * in compute type fp32 (TF32 off: the mode compared with the CPU) or bf16
 * (bf16 weights and activations, fp32 accumulation). The engine keeps the
 * fp32 master weights and optimizer shards, runs the collectives, AdamW and
 * clipping, all in device memory, and hands out working buffers of its
 * types (zr_engine_param_type, zr_engine_grad_type). Where a buffer is of
 * the compute type (fp32 everywhere in fp32; in bf16 with a bf16 engine,
 * zr_engine_config.work_type, the gathered units and the stage 1-2 working
 * copy, and the gradients of stages 2-3) the model computes on it directly
 * and its backward accumulates into it. Where it is not (bf16 compute on
 * stage 0's fp32 master and stage 0-1's fp32 gradients, or on an fp32
 * engine), the unit goes through one of three bf16 unit buffers of each
 * kind (unit 0, a block, the last unit: the schedule holds at most those at
 * once, the tied LM head reading unit 0 while the last unit runs): its
 * parameters cast in, its backward into a zeroed one added to the engine's
 * fp32 gradients. The loss is computed on the device and read through the
 * model's control buffer. Checkpoints are the CPU path's files: either
 * resumes the other.
 */
typedef struct zr_gpt_gpu {
    zr_gpt_cuda model;
    zr_device dev;
    zr_stream *stream; /* owned; the model's kernels, the engine's and the collectives' */
    zr_dtype param_type, grad_type; /* the engine's buffers it was made for */
    void *p[3], *g[3]; /* bf16 unit buffers where the engine's are fp32 (NULL otherwise):
                          unit 0, a block, the last unit */
    size_t numel[3];   /* elements of the slot's units */
} zr_gpt_gpu;

/*
 * Device bytes zr_gpt_gpu_init allocates for this shape, compute type and
 * engine configuration (activations, the unit buffers it needs).
 */
size_t zr_gpt_gpu_device_bytes(const zr_gpt_config *cfg, int B, int T, zr_dtype type,
                               const zr_engine_config *ecfg);
/*
 * On dev (a CUDA device: zr_device_open_for_rank) for B x T tokens; type F32
 * or BF16; for engines of configuration ecfg's buffer types (fp32 compute
 * needs fp32 ones: ZR_ERR_INVALID otherwise).
 */
zr_status zr_gpt_gpu_init(zr_gpt_gpu *g, const zr_device *dev, const zr_gpt_config *cfg, int B,
                          int T, zr_dtype type, const zr_engine_config *ecfg);
/* Safe on a zeroed struct and after a failed init. */
void zr_gpt_gpu_free(zr_gpt_gpu *g);

/*
 * zr_gpt_engine_micro and zr_gpt_engine_eval on the GPU: the same schedule and
 * the same calls; e must be an engine on g's GPU with the buffer types g was
 * made for (ZR_ERR_INVALID otherwise).
 */
zr_status zr_gpt_engine_micro_gpu(zr_gpt_gpu *g, zr_engine *e, const int *inputs,
                                  const int *targets, float *loss);
zr_status zr_gpt_engine_eval_gpu(zr_gpt_gpu *g, zr_engine *e, const int *inputs, const int *targets,
                                 float *loss);

#endif /* ZR_GPT_ENGINE_H */
