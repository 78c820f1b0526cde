/*
 * model_nocuda.c - the model's CUDA operators (ops_cuda.h) and cuBLAS
 * products (zr/model_cuda.h) in a build without CUDA: the Makefile compiles
 * it instead of ops_cuda.c and blas_cuda.c, and every call fails at once
 * with "built without CUDA". The plain-C halves are cuda_host.c's.
 */
#include "zr/model_cuda.h"

#include "ops_cuda.h"

static zr_status no_cuda(const char *what)
{
    ZR_FAIL(ZR_ERR_DEVICE, "%s: zr was built without CUDA (make CUDA=0, or no nvcc at build time)",
            what);
}

zr_status zr_op_cuda_encoder_fwd(zr_dtype t, void *out, const int *inp, const void *wte,
                                 const void *wpe, int B, int T, int C, zr_stream *s)
{
    return no_cuda("cuda encoder forward");
}

zr_status zr_op_cuda_encoder_bwd(zr_dtype t, void *dwte, void *dwpe, const void *dout,
                                 const int *btoken, const int *bstart, const int *bpos,
                                 int nbuckets, int B, int T, int C, zr_stream *s)
{
    return no_cuda("cuda encoder backward");
}

zr_status zr_op_cuda_layernorm_fwd(zr_dtype t, void *out, float *mean, float *rstd, const void *inp,
                                   const void *w, const void *b, int N, int C, zr_stream *s)
{
    return no_cuda("cuda layernorm forward");
}

zr_status zr_op_cuda_residual_layernorm_fwd(zr_dtype t, void *res, void *out, float *mean,
                                            float *rstd, const void *a, const void *x,
                                            const void *xbias, const void *w, const void *b, int N,
                                            int C, zr_stream *s)
{
    return no_cuda("cuda residual layernorm forward");
}

zr_status zr_op_cuda_residual_fwd(zr_dtype t, void *res, const void *a, const void *x,
                                  const void *xbias, int N, int C, zr_stream *s)
{
    return no_cuda("cuda residual forward");
}

size_t zr_op_cuda_colsum_scratch(int N, int C)
{
    return (size_t)C * 2;
}

zr_status zr_op_cuda_layernorm_bwd(zr_dtype t, void *dinp, void *dw, void *db, const void *dout,
                                   const void *inp, const void *w, const float *mean,
                                   const float *rstd, int N, int C, int accumulate, float *scratch,
                                   zr_stream *s)
{
    return no_cuda("cuda layernorm backward");
}

zr_status zr_op_cuda_bias_add(zr_dtype t, void *x, const void *bias, int N, int OC, zr_stream *s)
{
    return no_cuda("cuda bias add");
}

zr_status zr_op_cuda_colsum_acc(zr_dtype t, void *db, const void *d, int N, int OC, float *scratch,
                                zr_stream *s)
{
    return no_cuda("cuda column sum");
}

zr_status zr_op_cuda_bias_gelu_fwd(zr_dtype t, void *out, void *pre, const void *bias, int N,
                                   int OC, zr_stream *s)
{
    return no_cuda("cuda bias gelu forward");
}

zr_status zr_op_cuda_gelu_bwd(zr_dtype t, void *dinp, const void *inp, const void *dout, size_t n,
                              zr_stream *s)
{
    return no_cuda("cuda gelu backward");
}

zr_status zr_op_cuda_attention_fwd(zr_dtype t, void *out, float *lse, const void *qkv, int B, int T,
                                   int C, int NH, zr_stream *s)
{
    return no_cuda("cuda attention forward");
}

zr_status zr_op_cuda_attention_bwd(zr_dtype t, void *dqkv, float *delta, const void *dout,
                                   const void *qkv, const void *out, const float *lse, int B, int T,
                                   int C, int NH, zr_stream *s)
{
    return no_cuda("cuda attention backward");
}

zr_status zr_op_cuda_attention_fwd_scalar(zr_dtype t, void *out, float *lse, const void *qkv, int B,
                                          int T, int C, int NH, zr_stream *s)
{
    return no_cuda("cuda attention forward");
}

zr_status zr_op_cuda_attention_fwd_variant(int variant, zr_dtype t, void *out, float *lse,
                                           const void *qkv, int B, int T, int C, int NH,
                                           zr_stream *s)
{
    return no_cuda("cuda attention forward");
}

zr_status zr_op_cuda_attention_bwd_variant(int variant, int part, zr_dtype t, void *dqkv,
                                           float *delta, const void *dout, const void *qkv,
                                           const void *out, const float *lse, int B, int T, int C,
                                           int NH, zr_stream *s)
{
    return no_cuda("cuda attention backward");
}

zr_status zr_op_cuda_attention_bwd_scalar(zr_dtype t, void *dqkv, float *delta, const void *dout,
                                          const void *qkv, const void *out, const float *lse, int B,
                                          int T, int C, int NH, zr_stream *s)
{
    return no_cuda("cuda attention backward");
}

zr_status zr_op_cuda_xent_fwd(zr_dtype t, float *losses, float *lse, const void *logits,
                              const int *targets, int N, int V, int Vp, zr_stream *s)
{
    return no_cuda("cuda softmax cross-entropy forward");
}

zr_status zr_op_cuda_xent_bwd(zr_dtype t, void *logits, const float *lse, const int *targets,
                              float dloss, int N, int V, int Vp, zr_stream *s)
{
    return no_cuda("cuda softmax cross-entropy backward");
}

zr_status zr_op_cuda_xent_fused(zr_dtype t, float *losses, float *lse, void *logits,
                                const int *targets, float dloss, int N, int V, int Vp, zr_stream *s)
{
    return no_cuda("cuda softmax cross-entropy forward and backward");
}

zr_status zr_op_cuda_mean(float *out, const float *x, int n, zr_stream *s)
{
    return no_cuda("cuda mean");
}

zr_status zr_blas_create(zr_stream *s, zr_dtype type, zr_blas **out)
{
    *out = NULL;
    ZR_FAIL(ZR_ERR_DEVICE,
            "blas: zr was built without CUDA (make CUDA=0, or no nvcc at build time)");
}

void zr_blas_destroy(zr_blas *b)
{
    (void)b;
}

zr_status zr_blas_gemm(zr_blas *b, const zr_gemm *g, const void *A, const void *B, void *C)
{
    ZR_FAIL(ZR_ERR_DEVICE, "blas: zr was built without CUDA");
}

zr_status zr_blas_gemm_epi(zr_blas *b, const zr_gemm *g, const zr_gemm_epi *e, const void *A,
                           const void *B, void *C)
{
    ZR_FAIL(ZR_ERR_DEVICE, "blas: zr was built without CUDA");
}
