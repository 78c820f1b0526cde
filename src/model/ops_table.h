/*
 * ops_table.h - GPT-2's and the Llama family's operators on a device, as a
 * table (zr_op_table): the operators a device model calls (gpt_cuda.c) and tests/
 * test_backend_ops.c walks for every registered backend against the CPU's
 * (ops.h). One instance per device backend: zr_ops_cuda (ops_cuda.c, where
 * CUDA is built), reached through the GPT's backend (zr_gpt_backend_i.ops,
 * registered in gpt_engine.c). Internal to src/model and its tests.
 *
 * Conventions as ops.h: row-major, N = B*T rows, forward outputs
 * overwritten, parameter gradients accumulated (+=). Every pointer is
 * memory of the stream's device; t (ZR_DTYPE_F32 or ZR_DTYPE_BF16) is the
 * storage type of activations, parameters and their gradients, while
 * LayerNorm statistics (mean, rstd), attention log-sum-exps, losses and
 * scratch are always fp32. Everything is queued on s; a bad argument fails
 * before anything is queued (ZR_ERR_INVALID), a launch error is
 * ZR_ERR_DEVICE. No operator uses atomics: the same inputs give the same
 * bits on every run. Members marked optional may be NULL.
 *
 * The matrix products are the backend's BLAS (zr_blas_gemm, zr/model_cuda.h).
 */
#ifndef ZR_MODEL_OPS_TABLE_H
#define ZR_MODEL_OPS_TABLE_H

#include "zr/device.h"
#include "zr/quant.h"

#include <stddef.h>

/* Bytes of a cuBLASLt workspace (blas_cuda.c): what cuBLAS itself takes per handle on sm_90. */
#define ZR_BLAS_LT_WORKSPACE (32u << 20)

/*
 * The token buckets of the embedding's backward, built on the host: the
 * distinct tokens of inp[0..n-1] in increasing order (token[0..nb-1]), and
 * for bucket k the positions start[k] .. start[k+1]-1 of pos[], each
 * bucket's positions increasing. Arrays of n, n + 1 and n ints; count is
 * scratch of V ints. Returns nb. Tokens must be in [0, V).
 */
int zr_token_buckets(const int *inp, int n, int V, int *token, int *start, int *pos, int *count);

/* fp32 scratch floats a column sum over N rows of C columns needs (LayerNorm: both outputs). */
size_t zr_op_colsum_scratch(int N, int C);

/* Tensor-core attention variants of the CUDA instance (attention_fwd_variant). */
#define ZR_OP_CUDA_ATT_VARIANTS 3

typedef struct zr_op_table {
    const char *name; /* the backend's: "cuda" */
    /* out[b, t] = wte[inp[b, t]] + wpe[t]; inp holds device ints in [0, rows of wte). */
    zr_status (*encoder_fwd)(zr_dtype t, void *out, const int *inp, const void *wte,
                             const void *wpe, int B, int T, int C, zr_stream *s);

    /*
     * dwte[tok] += the dout rows of its positions (in position order), dwpe[t]
     * += dout[b, t] over b in order. btoken, bstart, bpos: device copies of
     * zr_token_buckets' arrays, nbuckets of them.
     */
    zr_status (*encoder_bwd)(zr_dtype t, void *dwte, void *dwpe, const void *dout,
                             const int *btoken, const int *bstart, const int *bpos, int nbuckets,
                             int B, int T, int C, zr_stream *s);

    zr_status (*layernorm_fwd)(zr_dtype t, void *out, float *mean, float *rstd, const void *inp,
                               const void *w, const void *b, int N, int C, zr_stream *s);
    /* res = a + (x + xbias) (xbias may be NULL), then out = LayerNorm(res) as stored. */
    zr_status (*residual_layernorm_fwd)(zr_dtype t, void *res, void *out, float *mean, float *rstd,
                                        const void *a, const void *x, const void *xbias,
                                        const void *w, const void *b, int N, int C, zr_stream *s);
    /* res = a + (x + xbias) (xbias may be NULL). */
    zr_status (*residual_fwd)(zr_dtype t, void *res, const void *a, const void *x,
                              const void *xbias, int N, int C, zr_stream *s);

    /*
     * dinp = (accumulate: +=) the input gradient; dw, db += the weight and bias
     * gradients (by column sums through scratch, zr_op_colsum_scratch).
     */
    zr_status (*layernorm_bwd)(zr_dtype t, void *dinp, void *dw, void *db, const void *dout,
                               const void *inp, const void *w, const float *mean, const float *rstd,
                               int N, int C, int accumulate, float *scratch, zr_stream *s);

    /* x[N, OC] += bias, row by row. */
    zr_status (*bias_add)(zr_dtype t, void *x, const void *bias, int N, int OC, zr_stream *s);
    /* db[OC] += the column sums of d[N, OC]. */
    zr_status (*colsum_acc)(zr_dtype t, void *db, const void *d, int N, int OC, float *scratch,
                            zr_stream *s);

    /* pre[N, OC] += bias (stored; bias may be NULL), then out = GELU(pre) (tanh form, as the
     * CPU's). */
    zr_status (*bias_gelu_fwd)(zr_dtype t, void *out, void *pre, const void *bias, int N, int OC,
                               zr_stream *s);
    /* dinp = gelu'(inp) * dout over n elements; dinp may be dout. */
    zr_status (*gelu_bwd)(zr_dtype t, void *dinp, const void *inp, const void *dout, size_t n,
                          zr_stream *s);

    /*
     * Causal self-attention of qkv [B, T, 3C] into out [B, T, C], and lse
     * [B, NH, T], each row's log-sum-exp of its scaled scores. Head size
     * C / NH at most 256. bf16 with head size 32, 64 or 128 runs on tensor
     * cores (attention_flash.cu), everything else on the scalar kernels
     * (attention_cuda.cu); the _scalar forms always take the scalar kernels
     * (the reference the tensor-core ones are tested against).
     */
    zr_status (*attention_fwd)(zr_dtype t, void *out, float *lse, const void *qkv, int B, int T,
                               int C, int NH, zr_stream *s);
    /*
     * dqkv [B, T, 3C] overwritten from dout [B, T, C], the forward's qkv, out
     * and lse; delta is scratch of B * NH * T floats (each row's dO . O).
     */
    zr_status (*attention_bwd)(zr_dtype t, void *dqkv, float *delta, const void *dout,
                               const void *qkv, const void *out, const float *lse, int B, int T,
                               int C, int NH, zr_stream *s);
    zr_status (*attention_fwd_scalar)(zr_dtype t, void *out, float *lse, const void *qkv, int B,
                                      int T, int C, int NH, zr_stream *s);
    zr_status (*attention_bwd_scalar)(zr_dtype t, void *dqkv, float *delta, const void *dout,
                                      const void *qkv, const void *out, const float *lse, int B,
                                      int T, int C, int NH, zr_stream *s);
    /*
     * The kernels by name, for zr bench attention and test_gpu_flash: variant
     * -1 the scalar kernels, 0 .. ZR_OP_CUDA_ATT_VARIANTS - 1 the tensor-core
     * ones where they apply (0: one buffer per operand, the default; 1: the
     * walked tiles double-buffered with cp.async; 2: 0 with the forward's
     * rescale skipped where no row's maximum moved). part (backward): 0 all, or
     * only the dO . O rows (1), dK and dV (2) or dQ (3), each reading what the
     * earlier parts wrote.
     */
    zr_status (*attention_fwd_variant)(int variant, zr_dtype t, void *out, float *lse,
                                       const void *qkv, int B, int T, int C, int NH, zr_stream *s);
    zr_status (*attention_bwd_variant)(int variant, int part, zr_dtype t, void *dqkv, float *delta,
                                       const void *dout, const void *qkv, const void *out,
                                       const float *lse, int B, int T, int C, int NH, zr_stream *s);

    /*
     * Row i of logits [N, Vp] (V valid columns): lse[i] = log sum exp, and
     * losses[i] = lse[i] - logits[i, targets[i]] when targets (device ints in
     * [0, V)) is not NULL. The probabilities are never stored.
     */
    zr_status (*xent_fwd)(zr_dtype t, float *losses, float *lse, const void *logits,
                          const int *targets, int N, int V, int Vp, zr_stream *s);
    /* In place: logits[:, :V] become (softmax - onehot(target)) * dloss, logits[:, V:Vp] 0. */
    zr_status (*xent_bwd)(zr_dtype t, void *logits, const float *lse, const int *targets,
                          float dloss, int N, int V, int Vp, zr_stream *s);
    /*
     * Both in one pass that reads the logits once from memory: losses and lse as
     * xent_fwd's (targets required), then logits[:, :V] become
     * dlogits as xent_bwd's, the same bits; for a step that needs no
     * logits after its loss.
     */
    zr_status (*xent_fused)(zr_dtype t, float *losses, float *lse, void *logits, const int *targets,
                            float dloss, int N, int V, int Vp, zr_stream *s);
    /* out[0] = the mean of x[0..n-1] (summed in double, in a fixed order). */
    zr_status (*mean)(float *out, const float *x, int n, zr_stream *s);

    /*
     * The Llama family's operators (issue 43), as ops.h's CPU ones
     * (ops_llama.c, attention.c's zr_op_attention_gqa_*). fp32 results are
     * the CPU's bits except where a sum runs in another order (the RMSNorm
     * weight's gradient, the attention); bf16 ones the CPU's on the same
     * (rounded) inputs, rounded once.
     *
     * RMSNorm: out = w * (x * rstd) per row of C, rstd [N] kept (fp32).
     */
    zr_status (*rmsnorm_fwd)(zr_dtype t, void *out, float *rstd, const void *inp, const void *w,
                             float eps, int N, int C, zr_stream *s);
    /* dinp = (accumulate: +=) the input gradient; dw += the weight's, through scratch
     * (zr_op_colsum_scratch floats). */
    zr_status (*rmsnorm_bwd)(zr_dtype t, void *dinp, void *dw, const void *dout, const void *inp,
                             const void *w, const float *rstd, int N, int C, int accumulate,
                             float *scratch, zr_stream *s);
    /*
     * Rotary embedding of x [B, T, NH * hd] (q or k; hd even), cos and sin
     * [T, hd / 2] fp32 as zr_op_rope_table makes them; out may be inp. The
     * backward rotates back (dinp may be dout).
     */
    zr_status (*rope_fwd)(zr_dtype t, void *out, const void *inp, const float *cosines,
                          const float *sines, int B, int T, int NH, int hd, zr_stream *s);
    zr_status (*rope_bwd)(zr_dtype t, void *dinp, const void *dout, const float *cosines,
                          const float *sines, int B, int T, int NH, int hd, zr_stream *s);
    /*
     * SwiGLU: out [N, IC] = silu(gate) * up, gate and up rows ld elements apart
     * (ld >= IC); the backward overwrites dgate and dup (rows ld apart; they may be
     * gate and up).
     */
    zr_status (*swiglu_fwd)(zr_dtype t, void *out, const void *gate, const void *up, int N, int IC,
                            int ld, zr_stream *s);
    zr_status (*swiglu_bwd)(zr_dtype t, void *dgate, void *dup, const void *dout, const void *gate,
                            const void *up, int N, int IC, int ld, zr_stream *s);
    /*
     * Causal attention with grouped key and value heads: q [B, T, NH hd], k
     * and v [B, T, NKV hd] (NKV divides NH; query head h reads key and value
     * head h / (NH / NKV)), out [B, T, NH hd], lse [B, NH, T]; hd at most 256.
     * variant as attention_fwd_variant's (-1: the scalar kernels; 0: tensor
     * cores where attention_tensor_cores says they run). The backward
     * overwrites dq, dk, dv (each key head's dk, dv summed over its query
     * heads in a fixed order); delta is scratch of B * NH * T floats.
     */
    zr_status (*attention_gqa_fwd)(int variant, zr_dtype t, void *out, float *lse, const void *q,
                                   const void *k, const void *v, int B, int T, int NH, int NKV,
                                   int hd, zr_stream *s);
    zr_status (*attention_gqa_bwd)(int variant, zr_dtype t, void *dq, void *dk, void *dv,
                                   float *delta, const void *dout, const void *q, const void *k,
                                   const void *v, const void *out, const float *lse, int B, int T,
                                   int NH, int NKV, int hd, zr_stream *s);
    /*
     * Whether the attention (variant >= 0) runs on tensor cores for storage t,
     * head size hd and NH / NKV = group (CUDA: bf16 with hd 32, 64 or 128, with
     * grouped heads 32 or 64: at 128 the backward's dK, dV and its walk over the
     * group's heads would spill), else on the scalar kernels.
     */
    int (*attention_tensor_cores)(zr_dtype t, int hd, int group);
} zr_op_table;

/* The CUDA instance (ops_cuda.c), only where CUDA is built. */
extern const zr_op_table zr_ops_cuda;

#endif /* ZR_MODEL_OPS_TABLE_H */
