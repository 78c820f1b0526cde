/*
 * ops_cuda_impl.h - the seam between the model's CUDA kernels (ops_cuda.cu,
 * attention_cuda.cu; C++) and their C API (ops_cuda.c): the launchers,
 * which queue work on a stream and return the runtime's status. The C side
 * checks arguments and decides where 16-byte accesses are allowed (vec);
 * the kernels trust it. bf16 = 1 selects the bf16 storage type, else fp32.
 *
 * Not installed; only src/model includes it. Exists only with CUDA.
 */
#ifndef ZR_OPS_CUDA_IMPL_H
#define ZR_OPS_CUDA_IMPL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of a column sum's first pass: the partials it leaves, a function of N only. */
int zr_op_k_colsum_parts(int N);

cudaError_t zr_op_k_launch_encoder_fwd(int bf16, void *out, const int *inp, const void *wte,
                                       const void *wpe, int B, int T, int C, int vec,
                                       cudaStream_t s);
cudaError_t zr_op_k_launch_encoder_bwd(int bf16, void *dwte, void *dwpe, const void *dout,
                                       const int *btoken, const int *bstart, const int *bpos,
                                       int nbuckets, int B, int T, int C, int vec, cudaStream_t s);

/* res (optional: NULL) = a + (x + xbias); out = LayerNorm(res or inp) */
typedef struct zr_op_k_ln {
    void *out, *res;
    float *mean, *rstd;
    const void *inp, *x, *xbias, *w, *b;
    int N, C, vec;
} zr_op_k_ln;
cudaError_t zr_op_k_launch_layernorm_fwd(int bf16, const zr_op_k_ln *a, cudaStream_t s);
/* res = a + (x + xbias) without a LayerNorm */
cudaError_t zr_op_k_launch_residual(int bf16, void *res, const void *a, const void *x,
                                    const void *xbias, int N, int C, int vec, cudaStream_t s);
/* dinp (+)= LayerNorm backward; dw, db += through scratch partials */
cudaError_t zr_op_k_launch_layernorm_bwd(int bf16, void *dinp, void *dw, void *db, const void *dout,
                                         const void *inp, const void *w, const float *mean,
                                         const float *rstd, int N, int C, int accumulate,
                                         float *scratch, int vec, cudaStream_t s);

/* RMSNorm (llama_cuda.cu): out, rstd forward; dinp (+)= and dw += through scratch backward */
typedef struct zr_op_k_rms {
    void *out, *dinp, *dw;
    float *rstd, *scratch;
    const void *inp, *w, *dout;
    float eps;
    int N, C, accumulate, vec;
} zr_op_k_rms;
cudaError_t zr_op_k_launch_rmsnorm_fwd(int bf16, const zr_op_k_rms *a, cudaStream_t s);
cudaError_t zr_op_k_launch_rmsnorm_bwd(int bf16, const zr_op_k_rms *a, cudaStream_t s);
/* dw[c] += the column sums of (x * rstd) dout (norm_cuda.cu's two passes) */
cudaError_t zr_op_k_launch_rmsnorm_dw(int bf16, void *dw, const void *dout, const void *inp,
                                      const float *rstd, int N, int C, float *scratch, int vec,
                                      cudaStream_t s);
/* rotary embedding of [B, T, NH * hd] by the [T, hd/2] table; sign -1: the backward */
cudaError_t zr_op_k_launch_rope(int bf16, void *out, const void *inp, const float *cosines,
                                const float *sines, int B, int T, int NH, int hd, float sign,
                                cudaStream_t s);
/* SwiGLU: forward (dout NULL) out = silu(gate) up, else dgate, dup from dout */
cudaError_t zr_op_k_launch_swiglu(int bf16, void *dgate, void *dup, void *out, const void *dout,
                                  const void *gate, const void *up, int N, int IC, int ld,
                                  cudaStream_t s);

cudaError_t zr_op_k_launch_bias_gelu(int bf16, void *out, void *pre, const void *bias, int N,
                                     int OC, int vec, cudaStream_t s);
cudaError_t zr_op_k_launch_gelu_bwd(int bf16, void *dinp, const void *inp, const void *dout,
                                    uint64_t n, int vec, cudaStream_t s);
cudaError_t zr_op_k_launch_bias_add(int bf16, void *x, const void *bias, int N, int OC, int vec,
                                    cudaStream_t s);
cudaError_t zr_op_k_launch_colsum(int bf16, void *db, const void *d, int N, int OC, float *scratch,
                                  int vec, cudaStream_t s);

cudaError_t zr_op_k_launch_xent_fwd(int bf16, float *losses, float *lse, const void *logits,
                                    const int *targets, int N, int V, int Vp, int vec,
                                    cudaStream_t s);
cudaError_t zr_op_k_launch_xent_bwd(int bf16, void *logits, const float *lse, const int *targets,
                                    float dloss, int N, int V, int Vp, int vec, cudaStream_t s);
/* xent_fwd then xent_bwd in one pass (targets required) */
cudaError_t zr_op_k_launch_xent_fused(int bf16, float *losses, float *lse, void *logits,
                                      const int *targets, float dloss, int N, int V, int Vp,
                                      int vec, cudaStream_t s);
cudaError_t zr_op_k_launch_mean(float *out, const float *x, int n, cudaStream_t s);

/*
 * Where the attention's operands are: q, k, v (dq, dk, dv) rows lq and lkv
 * elements apart, head h of a q row at h * hs, key and value head kh of a k or v
 * row at kh * hs; query head h reads key and value head h / group. GPT-2:
 * q = qkv, k = qkv + C, v = qkv + 2C, lq = lkv = 3C, group 1 (dq, dk, dv the
 * same in dqkv). Grouped heads: three tensors, lq = NH hs, lkv = NKV hs.
 */
typedef struct zr_op_k_qkv {
    const void *q, *k, *v;
    void *dq, *dk, *dv;
    int lq, lkv, group;
} zr_op_k_qkv;

/*
 * Attention: g = lanes per query row (1, 2, 4, 8 or 16, 16 * g >= head size);
 * C = NH * hs, the row of out and dout; x the operands (qkv and dqkv unused).
 */
typedef struct zr_op_k_att {
    void *out, *dqkv;
    float *lse, *delta;
    const void *qkv, *dout, *o;
    int B, T, C, NH, g, vec;
    float scale;
    int variant; /* tensor-core kernels: 0 the default, 1, 2 (attention_flash.cu) */
    int part;    /* backward: 0 every kernel, else only delta (1), dK/dV (2) or dQ (3) */
    zr_op_k_qkv x;
} zr_op_k_att;
/* the scalar kernels (attention_cuda.cu): fp32 or bf16, head sizes up to 256 */
cudaError_t zr_op_k_launch_attention_fwd(int bf16, const zr_op_k_att *a, cudaStream_t s);
cudaError_t zr_op_k_launch_attention_bwd(int bf16, const zr_op_k_att *a, cudaStream_t s);
/* the tensor-core kernels (attention_flash.cu): bf16, head size 32, 64 or 128 */
cudaError_t zr_op_k_launch_flash_fwd(const zr_op_k_att *a, cudaStream_t s);
cudaError_t zr_op_k_launch_flash_bwd(const zr_op_k_att *a, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* ZR_OPS_CUDA_IMPL_H */
