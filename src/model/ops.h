/*
 * ops.h - GPT-2's and the Llama family's operators on the CPU, shared by
 * gpt.c, the tests and the benchmarks. Internal to src/model (not a public
 * header).
 *
 * Conventions: row-major, N = B*T rows. Forward outputs are overwritten.
 * In backward, parameter gradients (dw, db) are accumulated (+=); the input
 * gradient is overwritten unless the name says "_acc".
 *
 * Threads: every operator runs on the process's pool (zr/pool.h), split so
 * that the thread count never changes a bit: matrix products by bands of
 * rows (a single-threaded cblas_sgemm each), per-row work by rows, sums over rows
 * (bias, LayerNorm and RMSNorm weight gradients, the embedding's) by columns,
 * each column summed over all rows in row order by one thread, attention by
 * (batch, head) forward and (batch, key/value head) backward. Vector code is
 * chosen at run time (AVX2, AVX-512, or the portable build's own), and every
 * path gives the same bits.
 */
#ifndef ZR_MODEL_OPS_H
#define ZR_MODEL_OPS_H

#include "../base/blas.h"

#include <stddef.h>
#include <stdint.h>

/*
 * Attention tiles: ZR_ATT_BQ query rows by ZR_ATT_BK keys. The forward's
 * online softmax rescales once per key block, so ZR_ATT_BK is part of the
 * definition of the result (the CPU and any other device must use the same
 * blocks to agree bit for bit); ZR_ATT_BQ only sets the work per task.
 * Tiles live on the stack of the thread that runs them, which bounds the
 * head size (checked by zr_gpt_config_check).
 */
#define ZR_ATT_BQ     64
#define ZR_ATT_BK     64
#define ZR_ATT_MAX_HS 256

/*
 * The kernels in use: AUTO (the widest the CPU has) or SCALAR (the
 * reference: the build's own target, and plain C for attention). Tests
 * force SCALAR to check that every path gives the same bits.
 */
typedef enum zr_ops_impl { ZR_OPS_IMPL_AUTO = 0, ZR_OPS_IMPL_SCALAR } zr_ops_impl;
void zr_ops_set_impl(zr_ops_impl impl);
/* "scalar", "avx2" or "avx512": what AUTO picks, or SCALAR when forced. */
const char *zr_ops_impl_name(void);
/* The same as 0, 1, 2, for the operators' own dispatch (main thread only). */
int zr_ops_isa(void);

void zr_op_encoder_fwd(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                       int C);
void zr_op_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                       int C);

void zr_op_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N, int C);
/* res = a + (t + tbias), then out = LayerNorm(res): the residual add fused in. */
void zr_op_residual_layernorm_fwd(float *res, float *out, float *mean, float *rstd, const float *a,
                                  const float *t, const float *tbias, const float *w,
                                  const float *b, int N, int C);
/* res = a + (t + tbias). */
void zr_op_residual_fwd(float *res, const float *a, const float *t, const float *tbias, int N,
                        int C);
void zr_op_layernorm_bwd_acc(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C);

/*
 * C[M, N] = op(A) op(B) + beta C, row-major, op(X) = X^T when tX != 0: one
 * single-threaded cblas_sgemm per band of rows of C, on the pool's threads,
 * so the result does not depend on the thread count.
 */
void zr_op_sgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
                 int ldb, float beta, float *C, int ldc);

/*
 * How a model's matrix products run (ops_gemm.c): fp32 (bf16 = 0; no scratch), or
 * on bf16 inputs with fp32 accumulation and output (oneDNN, src/base/blas.h), with
 * the scratch that needs: B rounded to bf16 (b_cap elements) and per pool thread a
 * band of op(A)'s rows (a_per elements each) and oneDNN's state. Zeroed = fp32.
 */
typedef struct zr_op_products {
    int bf16;
    uint16_t *a, *b;
    size_t a_per, b_cap;
    int threads;
    zr_blas_bf16_ctx *ctx; /* [threads] */
} zr_op_products;

/* Room for `threads` bands of a_per elements and a B of b_numel (grows only between calls). */
zr_status zr_op_products_reserve(zr_op_products *p, int threads, size_t a_per, size_t b_numel);
/* The bf16 scratch's bytes (0 for NULL or fp32). */
size_t zr_op_products_bytes(const zr_op_products *p);
void zr_op_products_free(zr_op_products *p);
/* The A x K operand rows a band of a bf16 product rounds (the scratch per thread: rows x K). */
#define ZR_GEMM_BF16_ROWS 512

/*
 * zr_op_sgemm's product under p's mode (p NULL: fp32). bf16: the same bits at any
 * thread count, beta 0 or 1; the scratch grows to fit a larger product than it was
 * reserved for.
 */
void zr_op_gemm(zr_op_products *p, int ta, int tb, int M, int N, int K, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc);

/* out[N, OC] = inp[N, C] @ w[OC, C]^T + bias (bias may be NULL); products under p. */
void zr_op_matmul_fwd(zr_op_products *p, float *out, const float *inp, const float *w,
                      const float *bias, int N, int C, int OC);
/* dinp = dout @ w (overwritten); dw += dout^T @ inp; db += column sums (db may be NULL). */
void zr_op_matmul_bwd(zr_op_products *p, float *dinp, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, int N, int C, int OC);
/* db[j] += sum over rows i (in order) of d[i, j]. */
void zr_op_colsum_acc(float *db, const float *d, int N, int OC);

/*
 * Causal self-attention, streamed over key blocks: qkv [B, T, 3C] -> out
 * [B, T, C], and lse [B, NH, T], each row's log-sum-exp of its scaled
 * scores, which is all the backward needs to recompute the softmax. No
 * T x T buffer exists at any point.
 */
void zr_op_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
/*
 * dqkv overwritten, from dout, the forward's inputs (qkv), output (out) and
 * lse; scratch holds B * NH * T floats (each row's dO . O).
 */
void zr_op_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                         const float *out, const float *lse, int B, int T, int C, int NH);
/*
 * The same forward, unblocked and in double precision, one (b, h) after
 * another: the accuracy reference of the tests (O(T^2) time, O(T) memory).
 */
void zr_op_attention_fwd_ref64(double *out, const float *qkv, int B, int T, int C, int NH);

/*
 * The same attention with grouped key and value heads (GQA: Llama, Mistral,
 * Qwen2): q [B, T, NH * hd], k and v [B, T, NKV * hd] (NKV divides NH;
 * query head h reads key and value head h / (NH / NKV)), out [B, T, NH * hd],
 * lse [B, NH, T]. The same key blocks and arithmetic as above: with
 * NKV = NH and q, k, v cut from a qkv, the bits of zr_op_attention_fwd.
 */
void zr_op_attention_gqa_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                             int B, int T, int NH, int NKV, int hd);
/*
 * dq, dk, dv overwritten (the shapes of q, k, v); scratch holds B * NH * T
 * floats. Each (batch, key head) sums its dk and dv over its query heads in
 * order: the thread count changes no bit.
 */
void zr_op_attention_gqa_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                             const float *q, const float *k, const float *v, const float *out,
                             const float *lse, int B, int T, int NH, int NKV, int hd);

/* ---- the Llama family's other operators (ops_llama.c) ---------------------- */

/* out = w * (x * rstd) per row of C, rstd = 1 / sqrt(mean(x^2) + eps) kept in rstd[N]. */
void zr_op_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, float eps, int N,
                       int C);
/* dinp += the input gradient, dw += the weight's (rows summed in order). */
void zr_op_rmsnorm_bwd_acc(float *dinp, float *dw, const float *dout, const float *inp,
                           const float *w, const float *rstd, int N, int C);

/* rope_scaling of type llama3 (llama3 = 0: none, the others unused). */
typedef struct zr_op_rope_scaling {
    int llama3;
    double factor, low_freq_factor, high_freq_factor, original_max_pos;
} zr_op_rope_scaling;
/* inv_freq[hd / 2] as transformers computes them (in float), scaled by sc (NULL: none). */
void zr_op_rope_inv_freq(float *inv_freq, int hd, double theta, const zr_op_rope_scaling *sc);
/* cos and sin [T, hd / 2] of (float)t * inv_freq[i], positions t = 0 .. T-1. */
void zr_op_rope_table(float *cosines, float *sines, const float *inv_freq, int T, int hd);
/*
 * Rotary embedding of x [B, T, NH * hd] (q or k), transformers' layout:
 * dimension i < hd/2 pairs with i + hd/2. out may alias inp; the backward
 * rotates dout back (dinp may alias dout).
 */
void zr_op_rope_fwd(float *out, const float *inp, const float *cosines, const float *sines, int B,
                    int T, int NH, int hd);
void zr_op_rope_bwd(float *dinp, const float *dout, const float *cosines, const float *sines, int B,
                    int T, int NH, int hd);

/*
 * SwiGLU: out[N, IC] = silu(gate) * up, silu(x) = x / (1 + exp(-x)); gate
 * and up rows ld floats apart (IC for separate tensors, 2 IC for one [N, 2 IC]
 * product). Backward: dgate, dup (rows ld apart) overwritten.
 */
void zr_op_swiglu_fwd(float *out, const float *gate, const float *up, int N, int IC, int ld);
void zr_op_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                      const float *up, int N, int IC, int ld);

/* pre += bias (rows of OC), then out = GELU(pre): the bias add fused in. */
void zr_op_bias_gelu_fwd(float *out, float *pre, const float *bias, int N, int OC);
/* dinp = gelu'(inp) * dout; dinp may alias dout; db (may be NULL) += column sums of dinp. */
void zr_op_gelu_bwd(float *dinp, float *db, const float *inp, const float *dout, int N, int OC);

/*
 * out = exp(inp) elementwise, the approximation softmax, attention and GELU
 * use: about 1 ulp on [-87, 88], clamped outside (finite, positive), NaN for
 * NaN.
 */
void zr_op_exp(float *out, const float *inp, size_t n);

/*
 * In place: logits [N, Vp] (first V columns valid) become softmax
 * probabilities (padded columns 0); losses[i] = -log p(targets[i]) when
 * targets is not NULL.
 */
void zr_op_softmax_xent_fwd(float *probs, float *losses, const int *targets, int N, int V, int Vp);
/* In place: probs become dlogits = (p - onehot) * dloss. */
void zr_op_softmax_xent_bwd(float *probs, const int *targets, float dloss, int N, int V, int Vp);

#endif
