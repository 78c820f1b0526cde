/*
 * blas_cuda.c - zr's matrix products on a CUDA device (zr/model_cuda.h):
 * the plan that turns a row-major product into cuBLAS's column-major call,
 * and a cuBLAS handle per stream and compute type that runs it.
 *
 * The plan is a plain function, always built and tested against a naive
 * GEMM on the CPU (tests/test_gemm_plan.c): the transposes, leading
 * dimensions and batch strides of every product the model makes come from
 * it, so a wrong argument shows on the CPU, not only on a GPU. The
 * reasoning: a row-major X with leading dimension ld is, read column-major
 * with the same ld, X^T. So row-major C = op(A) op(B) is column-major
 * C^T = op(B)^T op(A)^T: cuBLAS's first operand is B, its second A, m = N,
 * n = M, and each operand is transposed for cuBLAS exactly when it was for
 * the row-major product (B stored [K, N] row-major is op(B)^T = B^T
 * column-major as stored: no transpose; B stored [N, K] needs one).
 *
 * Precision: fp32 products use CUBLAS_COMPUTE_32F_PEDANTIC, which forbids
 * TF32 and every other reduced-precision path (NVIDIA_TF32_OVERRIDE
 * included): the fp32 mode is the one compared with the CPU. bf16 products
 * use CUBLAS_COMPUTE_32F: bf16 operands, fp32 accumulation and scaling, the
 * result rounded to bf16.
 */
#include "zr/model_cuda.h"

#include "../base/cudalib.h"
#include "../base/device_impl.h"

#include <limits.h>
#include <string.h>

zr_status zr_gemm_plan_make(const zr_gemm *g, zr_gemm_plan *p)
{
    memset(p, 0, sizeof *p);
    if (g->M < 0 || g->N < 0 || g->K < 0 || g->batch < 1) {
        ZR_FAIL(ZR_ERR_INVALID, "gemm: M %d, N %d, K %d must be >= 0 and batch %d >= 1", g->M, g->N,
                g->K, g->batch);
    }
    /* the length of one stored row of each operand */
    int arow = g->ta ? g->M : g->K, brow = g->tb ? g->K : g->N;
    if (g->lda < (arow > 1 ? arow : 1) || g->ldb < (brow > 1 ? brow : 1) ||
        g->ldc < (g->N > 1 ? g->N : 1)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "gemm: leading dimensions lda %d, ldb %d, ldc %d are shorter than a stored row "
                "(%d, %d, %d elements)",
                g->lda, g->ldb, g->ldc, arow, brow, g->N);
    }
    if (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0) {
        ZR_FAIL(ZR_ERR_INVALID, "gemm: batch strides must be >= 0 (%lld, %lld, %lld)", g->stride_a,
                g->stride_b, g->stride_c);
    }
    p->transa = g->tb != 0;
    p->transb = g->ta != 0;
    p->m = g->N;
    p->n = g->M;
    p->k = g->K;
    p->lda = g->ldb;
    p->ldb = g->lda;
    p->ldc = g->ldc;
    p->stride_a = g->stride_b;
    p->stride_b = g->stride_a;
    p->stride_c = g->stride_c;
    p->batch = g->batch;
    p->alpha = g->alpha;
    p->beta = g->beta;
    return ZR_OK;
}

#if ZR_CUDA

struct zr_blas {
    const zr_cudalib_cublas *lib; /* cuBLAS, opened by the first zr_blas_create */
    cublasHandle_t h;
    zr_dtype type;
};

static zr_status cublas_fail(const zr_cudalib_cublas *lib, cublasStatus_t st, const char *call,
                             const char *file, int line)
{
    ZR_FAIL(ZR_ERR_DEVICE, "%s failed at %s:%d: %s (%s)", call, file, line,
            lib->cublasGetStatusString(st), lib->cublasGetStatusName(st));
}

/* Propagate a failing call of b's cuBLAS: ZR_CUBLAS_CHECK(b, cublasCreate(&h)). */
#define ZR_CUBLAS_CHECK(b, call)                                                                   \
    do {                                                                                           \
        cublasStatus_t zr_bs_ = (b)->lib->call;                                                    \
        if (zr_bs_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            return cublas_fail((b)->lib, zr_bs_, #call, __FILE__, __LINE__);                       \
        }                                                                                          \
    } while (0)

static zr_status blas_setup(zr_blas *b, zr_stream *s)
{
    ZR_CHECK(zr_cudalib_load_cublas(&b->lib));
    ZR_CUBLAS_CHECK(b, cublasCreate(&b->h));
    ZR_CUBLAS_CHECK(b, cublasSetStream(b->h, zr_stream_cuda(s)));
    /* no tensor-op shortcuts in fp32; bf16 asks for fp32 accumulation by its compute type */
    ZR_CUBLAS_CHECK(b, cublasSetMathMode(b->h, b->type == ZR_DTYPE_F32 ? CUBLAS_PEDANTIC_MATH
                                                                       : CUBLAS_DEFAULT_MATH));
    return ZR_OK;
}

zr_status zr_blas_create(zr_stream *s, zr_dtype type, zr_blas **out)
{
    *out = NULL;
    if (s == NULL || zr_stream_device(s)->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "blas: needs a stream of a CUDA device, got %s",
                s == NULL ? "none" : "a CPU stream");
    }
    if (type != ZR_DTYPE_F32 && type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "blas: compute type %d is neither fp32 nor bf16", (int)type);
    }
    zr_blas *b;
    ZR_ALLOC(b, 1);
    b->type = type;
    zr_status st = blas_setup(b, s);
    if (st != ZR_OK) {
        zr_blas_destroy(b);
        return st;
    }
    *out = b;
    return ZR_OK;
}

void zr_blas_destroy(zr_blas *b)
{
    if (b == NULL) {
        return;
    }
    if (b->h != NULL) {
        b->lib->cublasDestroy(b->h);
    }
    zr_free(b);
}

zr_status zr_blas_gemm(zr_blas *b, const zr_gemm *g, const void *A, const void *B, void *C)
{
    zr_gemm_plan p;
    ZR_CHECK(zr_gemm_plan_make(g, &p));
    cudaDataType t = b->type == ZR_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasComputeType_t ct =
        b->type == ZR_DTYPE_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    cublasOperation_t oa = p.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t ob = p.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (p.batch == 1) {
        ZR_CUBLAS_CHECK(b, cublasGemmEx(b->h, oa, ob, p.m, p.n, p.k, &p.alpha, B, t, p.lda, A, t,
                                        p.ldb, &p.beta, C, t, p.ldc, ct, CUBLAS_GEMM_DEFAULT));
    } else {
        ZR_CUBLAS_CHECK(b, cublasGemmStridedBatchedEx(b->h, oa, ob, p.m, p.n, p.k, &p.alpha, B, t,
                                                      p.lda, p.stride_a, A, t, p.ldb, p.stride_b,
                                                      &p.beta, C, t, p.ldc, p.stride_c, p.batch, ct,
                                                      CUBLAS_GEMM_DEFAULT));
    }
    return ZR_OK;
}

#else /* !ZR_CUDA */

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

#endif /* ZR_CUDA */
