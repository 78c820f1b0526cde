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
zr_status zr_gpt_engine_init_params(zr_engine *e, const zr_gpt_config *cfg, uint64_t seed);

/*
 * Parameters from an llm.c model file of shape cfg (zr train --init), read
 * one unit at a time so that no rank ever holds the whole model.
 */
zr_status zr_gpt_engine_load_llmc(zr_engine *e, const zr_gpt_config *cfg, const char *path);

/*
 * The shape of a Hugging Face model folder (its config.json): GPT-2
 * (GPT2LMHeadModel) or the Llama family (arch ZR_ARCH_LLAMA; max_t its
 * max_position_embeddings). An architecture or key zr does not train is an
 * error naming it.
 */
zr_status zr_gpt_config_read_hf(const char *dir, zr_gpt_config *cfg);
/* The shape in one line: "L=12 NH=12 C=768 V=50257 max_seq_len=1024" (GPT-2), or the family and
 * its Llama fields. */
void zr_gpt_config_describe(const zr_gpt_config *cfg, char *out, size_t n);
/*
 * Parameters of shape cfg from the folder's safetensors (F32, BF16 or F16
 * to fp32 masters): every name and shape checked first, then each rank
 * reads only the elements of its optimizer shard of each unit. Collective:
 * every rank returns the same status (the first failure, agreed).
 */
zr_status zr_gpt_engine_load_hf(zr_engine *e, const zr_gpt_config *cfg, const char *dir);

/* ---- the GPT on a backend --------------------------------------------------------- */

/*
 * What computes the GPT's units on one kind of device, as a table in the
 * manner of ggml's ggml_backend_i: one instance per device kind, found by
 * zr_gpt_backend_of. The CPU's (gpt_backend_cpu.c) is the host model
 * (zr/model.h) in fp32 on fp32 engine buffers; the CUDA one
 * (gpt_backend_cuda.c) is the device model (zr/model_cuda.h) on an engine
 * whose state is on the same GPU, registered only where CUDA is built
 * (gpt_engine.c's list is the one place). Members marked optional may be
 * NULL. The schedule (zr_gpt_engine_micro) calls the unit members in order
 * on the engine's buffers, of the engine's types; a backend that queues
 * work (a stream) has run it once the engine has synchronised.
 *
 * A new backend is a file with one such table, its line in gpt_engine.c's
 * list, and its rows in tests/test_backend_ops.c's operator list.
 */
typedef struct zr_gpt_shape {
    int B, T;         /* micro-batch x sequence length */
    int recompute;    /* activation checkpointing (zr.model.activation_checkpointing) */
    zr_dtype compute; /* fp32, or bf16 (bf16.enabled: bf16 weights and activations on a GPU) */
} zr_gpt_shape;

typedef struct zr_gpt_backend_i {
    const char *name; /* "cpu", "cuda": the instance's name, in messages */
    /* The engine's working type for bf16.enabled: fp32 on the CPU (bf16 there is the products'
       inputs), bf16 on a GPU (zr_config_engine). */
    zr_dtype bf16_work_type;
    /* Optional: whether the shape fits the backend's kernels at all (NULL: any); a message
       naming the keys otherwise. */
    zr_status (*check_shape)(const zr_gpt_config *cfg, const zr_gpt_shape *s);
    /* Bytes the model allocates for shape s on engines of configuration ecfg (activations, unit
       buffers), and whether they and the engine's state live in device memory (1) or in the
       host's (0): what the trainer checks against which memory before allocating. */
    size_t (*model_bytes)(const zr_gpt_config *cfg, const zr_gpt_shape *s,
                          const zr_engine_config *ecfg);
    int device_memory;
    /* 1: activation checkpointing (zr_gpt_shape.recompute) is implemented; 0: every activation
       is kept whatever it asks */
    int recompute;
    zr_status (*init)(void **model, const zr_device *dev, const zr_gpt_config *cfg,
                      const zr_gpt_shape *s, const zr_engine_config *ecfg);
    void (*free)(void *model);
    /* Optional: the stream the model queues its work on (NULL: it computes at once). */
    zr_stream *(*stream)(void *model);
    /* Optional: the operators of the backend's device model (src/model/ops_table.h), which
       tests/test_backend_ops.c walks against the CPU's. */
    const struct zr_op_table *ops;
    /* Optional: matrix products on bf16 inputs (zr_gpt_set_products' result and message). */
    int (*set_products)(void *model, int bf16, char *why, size_t n);
    /* The engine's buffers must be where, and of the types, the model computes on. */
    zr_status (*check_engine)(void *model, const zr_engine *e);
    zr_status (*forward_begin)(void *model, const int *inputs, const int *targets);
    /* Unit u's forward on its parameters p (the last unit: and unit 0's, p0). */
    zr_status (*forward_unit)(void *model, int u, const void *p, const void *p0);
    /* The mean loss of the last forward (a backend that queues work waits for it). */
    zr_status (*loss)(void *model, float *loss);
    zr_status (*backward_begin)(void *model);
    /* Unit u's backward, accumulating into g (the last unit: and unit 0's g0). */
    zr_status (*backward_unit)(void *model, int u, const void *p, const void *p0, void *g,
                               void *g0);
} zr_gpt_backend_i;

/*
 * The backend of cfg's architecture on a device kind; ZR_ERR_DEVICE naming
 * both where this build has none.
 */
zr_status zr_gpt_backend_for(const zr_gpt_config *cfg, zr_device_kind kind,
                             const zr_gpt_backend_i **out);
/* GPT-2's backend on a device kind (zr_gpt_backend_for of a GPT-2 shape). */
zr_status zr_gpt_backend_of(zr_device_kind kind, const zr_gpt_backend_i **out);

/* The GPT on one backend: what the schedule, the trainer and the planner hold. */
typedef struct zr_gpt_run {
    const zr_gpt_backend_i *be;
    void *model;
    int owned; /* zr_gpt_run_init made the model (zr_gpt_run_free frees it) */
} zr_gpt_run;

/* The GPT of shape cfg x s on dev, for engines of configuration ecfg. */
zr_status zr_gpt_run_init(zr_gpt_run *r, const zr_device *dev, const zr_gpt_config *cfg,
                          const zr_gpt_shape *s, const zr_engine_config *ecfg);
/* A run over a host model the caller holds and frees (tests, benchmarks, the planner). */
zr_gpt_run zr_gpt_run_host(zr_gpt *m);
/* Safe on a zeroed struct and after a failed init. */
void zr_gpt_run_free(zr_gpt_run *r);
/* The stream r's model queues its work on; NULL where it computes at once. */
zr_stream *zr_gpt_run_stream(const zr_gpt_run *r);

/*
 * One micro-batch (B x T tokens of this rank): forward, backward, gradient
 * reductions started. *loss = this rank's mean loss. Call zr_engine_step
 * after the last micro-batch of a step. e must hold its buffers where r's
 * model computes, of the types it computes on (ZR_ERR_INVALID otherwise).
 */
zr_status zr_gpt_engine_micro(zr_gpt_run *r, zr_engine *e, const int *inputs, const int *targets,
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

/*
 * zr_gpt_engine_predict for the GPT on backend be in shape s, the model's own
 * bytes (be->model_bytes) in place of the host model's activations, split by
 * the memory each part lives in: *host (the program's allowance always; the
 * rest where be computes in host memory) and *device (all zero there).
 */
zr_status zr_gpt_engine_predict_on(const zr_gpt_backend_i *be, const zr_gpt_config *cfg,
                                   const zr_gpt_shape *s, const zr_engine_config *ecfg,
                                   const zr_comm *comm, zr_gpt_memory_prediction *host,
                                   zr_gpt_memory_prediction *device);

/* Forward only (evaluation): *loss = this rank's mean loss. */
zr_status zr_gpt_engine_eval(zr_gpt_run *r, zr_engine *e, const int *inputs, const int *targets,
                             float *loss);

/*
 * The CUDA backend's model bytes (zr_gpt_backend_i.model_bytes), in every
 * build: the planner sizes a GPU run from a probe file on any machine.
 */
size_t zr_gpt_cuda_engine_bytes(const zr_gpt_config *cfg, const zr_gpt_shape *s,
                                const zr_engine_config *ecfg);

#endif /* ZR_GPT_ENGINE_H */
