/*
 * blas_bf16_none.c - bf16 products on the CPU (blas.h) in a build without
 * oneDNN 2's header: the Makefile compiles it instead of blas_bf16.c, and
 * every product refuses, so the model keeps fp32 products.
 */
#include "blas.h"

#include <stdlib.h>
#include <string.h>

zr_status zr_blas_bf16_load(const char **kernel_out)
{
    *kernel_out = NULL;
    ZR_FAIL(ZR_ERR_IO, "zr was built without oneDNN 2's header (Debian's libdnnl-dev): "
                       "no bf16 products on the CPU");
}

zr_status zr_blas_gemm_bf16(zr_blas_bf16_ctx *ctx, int ta, int tb, int M, int N, int K,
                            const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                            float *C, int ldc)
{
    (void)ctx, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B;
    (void)ldb, (void)beta, (void)C, (void)ldc;
    const char *k;
    return zr_blas_bf16_load(&k);
}

void zr_blas_bf16_ctx_free(zr_blas_bf16_ctx *ctx)
{
    free(ctx->pad);
    memset(ctx, 0, sizeof *ctx);
}
