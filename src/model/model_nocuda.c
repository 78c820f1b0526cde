/*
 * model_nocuda.c - the cuBLAS products (zr/model_cuda.h) in a build without
 * CUDA: the Makefile compiles it instead of blas_cuda.c, and every call
 * fails at once with "built without CUDA". (The operators need no such
 * file: their table, zr_ops_cuda, is reached only through the CUDA backend,
 * which such a build does not register.) The plain-C halves are
 * cuda_host.c's.
 */
#include "zr/model_cuda.h"

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
