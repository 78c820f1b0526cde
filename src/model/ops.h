/*
 * ops.h - GPT-2 operators on the CPU, shared by gpt.c and the benchmarks'
 * helpers. Internal to src/model (not a public header).
 *
 * Conventions: row-major, N = B*T rows. Forward outputs are overwritten.
 * In backward, parameter gradients (dw, db) are accumulated (+=); the input
 * gradient is overwritten unless the name says "_acc".
 * Matrix products go through cblas_sgemm; everything else is written so that
 * gcc vectorizes it under -O3 -march=native -ffp-contract=off, which means
 * reductions use a fixed set of ZR_LANES partial sums (deterministic, and
 * vectorizable without -ffast-math).
 */
#ifndef ZR_MODEL_OPS_H
#define ZR_MODEL_OPS_H

#include <stddef.h>

/* Rows of one causal attention block: bigger blocks waste more of the upper
 * triangle, smaller ones make the sgemm calls too small to be efficient. */
#define ZR_ATT_ROWS 128

void zr_op_encoder_fwd(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                       int C);
void zr_op_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                       int C);

void zr_op_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N, int C);
void zr_op_layernorm_bwd_acc(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C);

/* out[N, OC] = inp[N, C] @ w[OC, C]^T + bias (bias may be NULL). */
void zr_op_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                      int OC);
/* dinp = dout @ w (overwritten); dw += dout^T @ inp; db += column sums (db may be NULL). */
void zr_op_matmul_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, int N, int C, int OC);

/* qkv [B, T, 3C] -> out [B, T, C]; att [B, NH, T, T] keeps the softmax. */
void zr_op_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv overwritten; scratch holds ZR_ATT_ROWS * T floats. */
void zr_op_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                         const float *att, int B, int T, int C, int NH);

void zr_op_gelu_fwd(float *out, const float *inp, size_t n);
/* dinp = gelu'(inp) * dout; dinp may alias dout. */
void zr_op_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);

/*
 * out = exp(inp) elementwise, the approximation softmax and GELU use: about
 * 1 ulp on [-87, 88], clamped outside (finite, positive), NaN for NaN.
 */
void zr_op_exp(float *out, const float *inp, size_t n);

/* out = a + b, elementwise. */
void zr_op_add(float *out, const float *a, const float *b, size_t n);

/*
 * In place: logits [N, Vp] (first V columns valid) become softmax
 * probabilities (padded columns 0); losses[i] = -log p(targets[i]) when
 * targets is not NULL.
 */
void zr_op_softmax_xent_fwd(float *probs, float *losses, const int *targets, int N, int V, int Vp);
/* In place: probs become dlogits = (p - onehot) * dloss. */
void zr_op_softmax_xent_bwd(float *probs, const int *targets, float dloss, int N, int V, int Vp);

#endif
