/*
 * zr/model.h - GPT-2 on the CPU in fp32, cut into units that the ZeRO
 * engine can gather and free one at a time, plus llm.c / safetensors I/O
 * and Hugging Face folders in.
 *
 * Parameters live outside the model. They are split into L + 2 units, each a
 * flat fp32 buffer the caller owns:
 *     unit 0       embedding  {wte [Vp, C], wpe [maxT, C]}
 *     unit 1..L    block l-1  {ln1w, ln1b, qkvw, qkvb, attprojw, attprojb,
 *                              ln2w, ln2b, fcw, fcb, fcprojw, fcprojb}
 *     unit L + 1   final      {lnfw, lnfb}
 * Matrices are stored [out, in] row-major as in llm.c. The LM head is tied to
 * wte, so the final unit also reads (forward) and accumulates into (backward)
 * unit 0. Only the first V rows of wte are used; the padded rows stay zero.
 *
 * A zr_gpt owns the activations of one B x T micro-batch for every layer
 * (with activation checkpointing, zr_gpt_init_ex: every block's output, and
 * one block's worth recomputed in the backward), never parameters, so a
 * unit's buffer need only be resident while its forward_unit /
 * backward_unit call runs. Calls must come in order:
 *     forward_begin, forward_unit 0 .. L+1, [backward_begin,
 *     backward_unit L+1 .. 0]
 * and a wrong order fails with ZR_ERR_INVALID.
 *
 * Determinism: the same inputs and parameters give bit-identical outputs
 * regardless of where the unit buffers live and of the thread count
 * (zr_gpt_set_threads): every loop, the matrix products included, runs on
 * zr's pool split so that each output element is computed alone, in a fixed
 * order (see src/model/ops.h). Attention streams over key blocks and keeps
 * O(T) memory per head, never a T x T matrix.
 * Nothing here depends on MPI.
 */
#ifndef ZR_MODEL_H
#define ZR_MODEL_H

#include "zr/base.h"

#include <stddef.h>
#include <stdint.h>

/*
 * The Llama family's shape (LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM: zr/llama.h), as its config.json gives it.
 */
typedef struct zr_llama_config {
    int family; /* 1 Llama, 2 Mistral, 3 Qwen2 (src/model/hf_config.h's zr_hf_family) */
    int vocab, hidden, layers, heads, kv_heads, head_dim, intermediate;
    double norm_eps, rope_theta;
    int rope_llama3; /* rope_scaling of type llama3, with: */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_pos;
    int tied;
    int qkv_bias, o_bias, mlp_bias;
    int sliding_window; /* 0: none; shorter than T is refused */
} zr_llama_config;

/* The decoder's architecture: what computes the units (zr/gpt_engine.h's backends). */
typedef enum zr_model_arch {
    ZR_ARCH_GPT2 = 0,  /* GPT-2 (this header's model) */
    ZR_ARCH_LLAMA = 1, /* the Llama family (zr/llama.h) */
} zr_model_arch;

/*
 * A decoder-only transformer's shape: what the engine's units, the
 * checkpoints and the planner are sized from. A GPT-2 is the first six
 * fields (arch 0); a Llama-family model sets arch and llama, and repeats its
 * vocab (padded_vocab = vocab: no padded rows), layers, heads and hidden
 * size in the fields GPT-2 reads (max_t: max_position_embeddings).
 */
typedef struct zr_gpt_config {
    int max_t;        /* maximum sequence length (rows of wpe; GPT-2: 1024), >= the T trained on */
    int vocab;        /* real vocabulary size V */
    int padded_vocab; /* Vp >= V: rows of wte, a multiple of 64 or 128 in practice */
    int layers;       /* L */
    int heads;        /* NH; channels % heads == 0 */
    int channels;     /* C */
    zr_model_arch arch;
    zr_llama_config llama; /* arch == ZR_ARCH_LLAMA only */
} zr_gpt_config;

/*
 * One parameter tensor inside its unit. offset and numel count floats from
 * the start of the unit's flat buffer. decay = 1 for matrices (weight decay
 * applies), 0 for LayerNorm parameters and biases.
 */
typedef struct zr_tensor_desc {
    const char *name; /* llm.c short name: "wte", "qkvw", "lnfb", ... */
    size_t offset, numel;
    int ndim;
    int shape[4];
    int decay;
} zr_tensor_desc;

/* Tensors per GPT-2 block unit, and the most a unit of any architecture has (a Llama layer's 16).
 */
#define ZR_GPT_BLOCK_TENSORS    12
#define ZR_GPT_MAX_UNIT_TENSORS 16

/* Activations of one transformer block for the current micro-batch. */
typedef struct zr_gpt_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* [BT, C], [BT], [BT] */
    float *qkv;                       /* [BT, 3C] */
    float *atty;                      /* [BT, C] attention output before attproj */
    float *att_lse;                   /* [B, NH, T] log-sum-exp of each row's attention scores */
    float *res2;                      /* [BT, C] residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu; /* [BT, 4C] */
    float *res3;           /* [BT, C] block output */
} zr_gpt_layer_acts;

/* Fields are read-only for callers; use the functions below. */
typedef struct zr_gpt {
    zr_gpt_config cfg;
    int B, T;
    zr_tensor_desc unit0_desc[2], block_desc[ZR_GPT_BLOCK_TENSORS], final_desc[2];
    size_t unit0_numel, block_numel, final_numel;

    int *inputs, *targets; /* [BT] copies of the current micro-batch */
    int has_targets;
    float *encoded;            /* [BT, C] */
    zr_gpt_layer_acts *layers; /* [L] */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *probs;  /* [BT, Vp] softmax; overwritten by dlogits in backward */
    float *losses; /* [BT] */
    float loss;

    /* backward scratch, reused by every block */
    float *dres;      /* [BT, C] gradient of the residual stream */
    float *dln;       /* [BT, C] */
    float *datty;     /* [BT, C] */
    float *dbig;      /* [BT, 4C] dfch_gelu / dfch, then dqkv */
    float *att_delta; /* [B, NH, T] attention backward scratch: dO . O per row */
    float *tmp;       /* [BT, C] projection output before the residual add */

    int recompute;          /* activation checkpointing: blocks share one activation set */
    int acts_layer;         /* the block whose activations the shared set holds (-1: none) */
    int fwd_next, bwd_next; /* call-order state */
    float *arena;           /* owns every buffer above */
    size_t arena_floats;
    struct zr_op_products *products; /* bf16 matrix products' mode and scratch; NULL: fp32 */
} zr_gpt;

/* ---- configuration and parameter layout (no zr_gpt needed) -------------- */

/* Checks every field (positive, C % NH == 0, head size C / NH <= 256, Vp >= V); names the bad
 * field. */
zr_status zr_gpt_config_check(const zr_gpt_config *cfg);

/* 1 when a and b are the same model (every field that shapes it; not their padding bytes). */
int zr_gpt_config_equal(const zr_gpt_config *a, const zr_gpt_config *b);
int zr_gpt_config_unit_count(const zr_gpt_config *cfg);
size_t zr_gpt_config_unit_numel(const zr_gpt_config *cfg, int u);
/* Fills out (ZR_GPT_MAX_UNIT_TENSORS entries) and returns the count; names are static. */
int zr_gpt_config_unit_tensors(const zr_gpt_config *cfg, int u, zr_tensor_desc *out);
/* Total parameter count (all units, padded wte rows included). */
size_t zr_gpt_config_param_count(const zr_gpt_config *cfg);
/*
 * Where element i of unit u lies, for messages: "qkvw of layer 2 (unit 3),
 * element 17" ("wte (unit 0), ..."; past the unit's tensors: its padding).
 */
void zr_gpt_config_element_name(const zr_gpt_config *cfg, int u, size_t i, char *out, size_t n);

/* ---- the model ---------------------------------------------------------- */

/* Allocates activations for B x T (T <= max_t). Free with zr_gpt_free. */
zr_status zr_gpt_init(zr_gpt *m, const zr_gpt_config *cfg, int B, int T);
/*
 * Same, with activation checkpointing when recompute != 0: the backward of
 * each block runs its forward again from the block's saved input. Outputs
 * and gradients are bit-identical to recompute = 0 given the same
 * parameters; about one more forward of the blocks in time, (L - 1) blocks'
 * activations less in memory. Under ZeRO-3 the recomputation runs on the
 * weights the backward gathers: with hpZ on a bf16 wire those are the
 * secondary's rounded copy, not the forward's, so the result then differs.
 */
zr_status zr_gpt_init_ex(zr_gpt *m, const zr_gpt_config *cfg, int B, int T, int recompute);
/* Bytes of activations (and token copies) m holds for its micro-batch. */
size_t zr_gpt_activation_bytes(const zr_gpt *m);
/* The same before any zr_gpt exists (cfg must pass zr_gpt_config_check). */
size_t zr_gpt_config_activation_bytes(const zr_gpt_config *cfg, int B, int T, int recompute);
/* Safe on a zeroed struct and after a failed init. */
void zr_gpt_free(zr_gpt *m);

/*
 * Threads of every model and AdamW loop in the process: zr's pool
 * (zr_threads_set), which also runs the matrix products as one
 * single-threaded OpenBLAS call per thread (OpenBLAS's own threads are set
 * to 1). Clamped to 1 .. ZR_POOL_MAX_THREADS; results do not depend on it.
 */
void zr_gpt_set_threads(int threads);
/*
 * The matrix products' inputs: fp32 (bf16 = 0, the default, equal to llm.c bit for
 * bit), or bf16 with fp32 accumulation and output (bf16 = 1, what bf16.enabled asks
 * for) where the CPU has AMX-BF16 or AVX512_BF16 and oneDNN 2 opens (src/base/blas.h;
 * ZR_CPU_BF16=0 turns it off, =force on whatever the CPU). Everything else stays fp32.
 * Returns 1 when the products run in bf16, 0 in fp32, -1 on no memory for their
 * scratch (zr_error_message); why: the kernel, or why fp32. Same bits at any thread
 * count either way; zr_gpt_activation_bytes counts the scratch.
 */
int zr_gpt_set_products(zr_gpt *m, int bf16, char *why, size_t n);
/* The bytes of that scratch for a B x T micro-batch at `threads` threads (for predictions). */
size_t zr_gpt_config_products_bytes(const zr_gpt_config *cfg, int B, int T, int threads);
/* The vector kernels the model's loops run on this CPU: "scalar", "avx2" or "avx512". */
const char *zr_gpt_kernels_name(void);

/* L + 2: unit 0 = embedding, 1..L = blocks, L + 1 = final LayerNorm. */
int zr_gpt_unit_count(const zr_gpt *m);
size_t zr_gpt_unit_numel(const zr_gpt *m, int u);
/* Sets *out to descriptions owned by m (valid until zr_gpt_free); returns the count. */
int zr_gpt_unit_tensors(const zr_gpt *m, int u, const zr_tensor_desc **out);

/*
 * GPT-2 initialisation of unit u: matrices N(0, 0.02), the residual
 * projections (attprojw, fcprojw) scaled by 1/sqrt(2L), LayerNorm weights 1,
 * biases 0, padded wte rows 0. Depends only on (seed, u, config), so every
 * rank initialises its units identically without communication.
 */
void zr_gpt_unit_init_params(const zr_gpt *m, int u, float *params, uint64_t seed);
/* The same from the configuration alone (no model allocated). */
void zr_gpt_config_unit_init(const zr_gpt_config *cfg, int u, float *params, uint64_t seed);

/*
 * Start a forward pass on B*T tokens (copied). targets may be NULL: then no
 * loss is computed and backward is refused. Tokens must be in [0, V).
 */
zr_status zr_gpt_forward_begin(zr_gpt *m, const int *inputs, const int *targets);
/* params: unit u's buffer; unit0_params: unit 0's buffer, read only by u = L+1. */
zr_status zr_gpt_forward_unit(zr_gpt *m, int u, const float *params, const float *unit0_params);
/* Mean cross-entropy over B*T after the last unit (NaN before, or without targets). */
float zr_gpt_loss(const zr_gpt *m);
/* [B*T, Vp] next-token probabilities after the last forward unit, before backward. */
const float *zr_gpt_probs(const zr_gpt *m);

/* Requires a complete forward pass with targets. */
zr_status zr_gpt_backward_begin(zr_gpt *m);
/*
 * Accumulates (+=) d(loss)/d(params of u) into grads (unit u's numel);
 * u = L+1 also accumulates the LM-head gradient into unit0_grads.
 */
zr_status zr_gpt_backward_unit(zr_gpt *m, int u, const float *params, const float *unit0_params,
                               float *grads, float *unit0_grads);

/* FLOPs of one forward+backward on B x T tokens (matmuls + causal attention). */
double zr_gpt_flops_per_step(const zr_gpt_config *cfg, int B, int T);

/* ---- files (gpt_io.c) --------------------------------------------------- */

#define ZR_LLMC_MODEL_MAGIC        20240326
#define ZR_LLMC_MODEL_VERSION_FP32 3

/*
 * llm.c GPT-2 model file: 256 x int32 header (magic, version 3, maxT, V, L,
 * NH, C, Vp), then every parameter in llm.c's order, each tensor stacked over
 * layers. units[u] points to unit u's buffer. Written to "<path>.tmp",
 * fsynced and renamed, so a crash never leaves a half-written file at path.
 * A weight that is not finite is refused (ZR_ERR_INVALID, naming the tensor
 * and the element), leaving nothing at path; so is it by the safetensors writer.
 */
zr_status zr_gpt_write_llmc(const char *path, const zr_gpt_config *cfg, float *const *units);
/* Reads and validates the header and the file size; fills cfg. */
zr_status zr_gpt_read_llmc_config(const char *path, zr_gpt_config *cfg);
/*
 * Reads the parameters into units (allocated by the caller with
 * zr_gpt_config_unit_numel sizes for cfg). The file's header must match cfg.
 * A truncated, oversized or foreign file gives ZR_ERR_FORMAT naming the file,
 * and so does a NaN or an infinity (checked as each piece is read), naming
 * the tensor and the element too.
 */
zr_status zr_gpt_read_llmc(const char *path, const zr_gpt_config *cfg, float *const *units);
/*
 * Reads only unit u (zr_gpt_config_unit_numel(cfg, u) floats into out), so
 * that a run starting from the file (zr train --init) holds one unit at a
 * time rather than the whole model. Same checks as zr_gpt_read_llmc.
 */
zr_status zr_gpt_read_llmc_unit(const char *path, const zr_gpt_config *cfg, int u, float *out);

/*
 * Consolidated safetensors file with Hugging Face GPT-2 names (wte.weight
 * [V, C] unpadded, wpe.weight, h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight
 * [C, 3C] (Conv1D: [in, out], i.e. transposed), ..., ln_f.bias), F32.
 * Same temporary-name + fsync + rename discipline.
 */
zr_status zr_gpt_write_safetensors(const char *path, const zr_gpt_config *cfg, float *const *units);

/*
 * GPT-2 from a Hugging Face folder (gpt_hf.c): GPT2LMHeadModel's
 * config.json into cfg (max_t = n_positions, padded_vocab = vocab rounded up
 * to a multiple of 128; n_inner other than 4 n_embd, layer_norm_epsilon
 * other than 1e-5 or an untied head refused: ZR_ERR_INVALID naming the key).
 */
zr_status zr_gpt_read_hf_config(const char *dir, zr_gpt_config *cfg);
/*
 * Elements [first, first + count) of unit u (into out[0 .. count)) from the
 * folder's model.safetensors or shards (F32, BF16 or F16), reading only
 * their bytes: count = zr_gpt_config_unit_numel(cfg, u) from 0 is the whole
 * unit. Names with or without "transformer.", the Conv1D weights ([in, out]
 * there) transposed, wte's padding rows zero. Every tensor of the unit
 * present with its shape and no tensor unknown to GPT-2 in the files (the
 * attention-mask buffers attn.bias / attn.masked_bias of old files aside),
 * whatever the range, and the values read finite; each failure
 * ZR_ERR_FORMAT naming the file and the tensor.
 */
zr_status zr_gpt_read_hf_range(const char *dir, const zr_gpt_config *cfg, int u, size_t first,
                               size_t count, float *out);
/*
 * The Hugging Face name of unit u's tensor i without "transformer."
 * ("wte.weight", "h.0.attn.c_attn.weight", ...) into out; returns 1 for a
 * Conv1D weight (stored [in, out] there), 0 for another, -1 for no tensor.
 */
int zr_gpt_config_hf_name(const zr_gpt_config *cfg, int u, int i, char *out, size_t n);

#endif /* ZR_MODEL_H */
