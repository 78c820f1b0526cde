/*
 * blas_cuda.c - zr's matrix products on a CUDA device (zr/model_cuda.h):
 * the plan that turns a row-major product into cuBLAS's column-major call,
 * and a cuBLAS handle per stream and compute type that runs it; products
 * with an epilogue (bias, bias + GELU keeping GELU's input, GELU's
 * backward) go through cuBLASLt on the same stream, with one workspace and
 * the heuristic's algorithm chosen once per shape and kept.
 *
 * The plan is a plain function (cuda_host.c), built in every build and tested against a naive
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
 *
 * Compiled only where CUDA is built; a build without compiles model_nocuda.c instead.
 */
#include "zr/model_cuda.h"

#include "../base/cudalib.h"
#include "../base/device_impl.h"
#include "ops_table.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

#define LT_WORKSPACE ZR_BLAS_LT_WORKSPACE
#define LT_PLANS     16 /* shapes kept; the model makes 3 */
#define LT_KEY       16

/* One shape's cuBLASLt descriptors and the algorithm the heuristic chose for them. */
typedef struct lt_plan {
    int used;
    int key[LT_KEY]; /* transposes, sizes, leading dimensions, epilogue, alignments */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int unfused; /* the heuristic had no algorithm: a plain GEMM and the element-wise kernel */
} lt_plan;

struct zr_blas {
    const zr_cudalib_cublas *lib; /* cuBLAS, opened by the first zr_blas_create */
    cublasHandle_t h;
    zr_dtype type;
    zr_stream *s;
    /* cuBLASLt, set up by the first zr_blas_gemm_epi */
    const zr_cudalib_cublaslt *lt;
    cublasLtHandle_t lth;
    void *ws;
    lt_plan plans[LT_PLANS];
    int evict; /* the next plan to replace once all are used */
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

static zr_status lt_fail(const zr_cudalib_cublaslt *lt, cublasStatus_t st, const char *call,
                         const char *file, int line)
{
    ZR_FAIL(ZR_ERR_DEVICE, "%s failed at %s:%d: %s (%s)", call, file, line,
            lt->cublasLtGetStatusString(st), lt->cublasLtGetStatusName(st));
}

/* Propagate a failing call of b's cuBLASLt: ZR_LT_CHECK(b, cublasLtCreate(&h)). */
#define ZR_LT_CHECK(b, call)                                                                       \
    do {                                                                                           \
        cublasStatus_t zr_ls_ = (b)->lt->call;                                                     \
        if (zr_ls_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            return lt_fail((b)->lt, zr_ls_, #call, __FILE__, __LINE__);                            \
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

/* Destroys what p holds (NULL descriptors are skipped), leaving it unused. */
static void lt_plan_clear(zr_blas *b, lt_plan *p)
{
    if (p->desc != NULL) {
        b->lt->cublasLtMatmulDescDestroy(p->desc);
    }
    cublasLtMatrixLayout_t l[3] = {p->la, p->lb, p->lc};
    for (int i = 0; i < 3; i++) {
        if (l[i] != NULL) {
            b->lt->cublasLtMatrixLayoutDestroy(l[i]);
        }
    }
    memset(p, 0, sizeof *p);
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
    b->s = s;
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
    for (int i = 0; i < LT_PLANS; i++) {
        lt_plan_clear(b, &b->plans[i]);
    }
    if (b->lth != NULL) {
        b->lt->cublasLtDestroy(b->lth);
    }
    zr_device_free(zr_stream_device(b->s), b->ws);
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

/* ---- cuBLASLt: products with epilogues ---------------------------------------------------- */

/* Set one attribute of matmul descriptor d to the value of variable v. */
#define LT_SET(b, d, attr, v)                                                                      \
    ZR_LT_CHECK(b, cublasLtMatmulDescSetAttribute((d), (attr), &(v), sizeof(v)))

/* The largest power of two up to 256 dividing p's address (cuBLASLt's algorithms assume one). */
static int align_of(const void *p)
{
    int a = 256;
    while (a > 1 && (uintptr_t)p % (uintptr_t)a != 0) {
        a /= 2;
    }
    return a;
}

static uint32_t lt_epilogue(zr_gemm_epilogue k)
{
    switch (k) {
    case ZR_GEMM_EPI_BIAS:
        return CUBLASLT_EPILOGUE_BIAS;
    case ZR_GEMM_EPI_BIAS_GELU:
        return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case ZR_GEMM_EPI_DGELU:
        return CUBLASLT_EPILOGUE_DGELU;
    default:
        return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

static zr_status epi_check(const zr_gemm *g, const zr_gemm_epi *e)
{
    int bias = e->kind == ZR_GEMM_EPI_BIAS || e->kind == ZR_GEMM_EPI_BIAS_GELU;
    int aux = e->kind == ZR_GEMM_EPI_BIAS_GELU || e->kind == ZR_GEMM_EPI_DGELU;
    if ((int)e->kind < ZR_GEMM_EPI_NONE || e->kind > ZR_GEMM_EPI_DGELU || g->batch != 1 ||
        (e->kind != ZR_GEMM_EPI_NONE && g->beta != 0.0f)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "gemm epilogue %d: needs a known epilogue, batch 1 (got %d) and beta 0 with an "
                "epilogue (got %g)",
                (int)e->kind, g->batch, (double)g->beta);
    }
    if ((bias && e->bias == NULL) || (aux && e->aux == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "gemm epilogue %d: the %s pointer is NULL", (int)e->kind,
                bias && e->bias == NULL ? "bias" : "auxiliary");
    }
    if (aux && (e->ldaux < g->N || e->ldaux % 8 != 0)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "gemm epilogue %d: the auxiliary row stride %d must be >= N = %d and a multiple "
                "of 8 (cuBLASLt's rule)",
                (int)e->kind, e->ldaux, g->N);
    }
    return ZR_OK;
}

/* cuBLASLt's handle and workspace, once per zr_blas. */
static zr_status lt_setup(zr_blas *b)
{
    if (b->lth != NULL) {
        return ZR_OK;
    }
    ZR_CHECK(zr_cudalib_load_cublaslt(&b->lt));
    if (b->ws == NULL) {
        ZR_CHECK(
            zr_device_alloc_at(zr_stream_device(b->s), &b->ws, LT_WORKSPACE, __FILE__, __LINE__));
    }
    ZR_LT_CHECK(b, cublasLtCreate(&b->lth));
    return ZR_OK;
}

/* The heuristic's first algorithm for q's descriptors, operands aligned as align (A, B, C, D). */
static zr_status lt_choose(zr_blas *b, lt_plan *q, const int align[4])
{
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t r;
    int n = 0, asked = 0;
    uint64_t ws = LT_WORKSPACE;
    const char *call = "cublasLtMatmulPreferenceCreate";
    cublasStatus_t st = b->lt->cublasLtMatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS) {
        call = "cublasLtMatmulPreferenceSetAttribute";
        st = b->lt->cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    }
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++) {
        uint32_t a = (uint32_t)align[i];
        st = b->lt->cublasLtMatmulPreferenceSetAttribute(
            pref,
            (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i),
            &a, sizeof a);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        call = "cublasLtMatmulAlgoGetHeuristic";
        asked = 1;
        st = b->lt->cublasLtMatmulAlgoGetHeuristic(b->lth, q->desc, q->la, q->lb, q->lc, q->lc,
                                                   pref, 1, &r, &n);
    }
    int none = asked && n < 1 && (st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_SUPPORTED);
    if (pref != NULL) {
        b->lt->cublasLtMatmulPreferenceDestroy(pref);
    }
    if (none) { /* this shape and epilogue on this GPU: the unfused path, decided once */
        ZR_DEBUG("cuBLASLt: no algorithm for %s; epilogue unfused", call);
        q->unfused = 1;
        return ZR_OK;
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        return lt_fail(b->lt, st, call, __FILE__, __LINE__);
    }
    q->algo = r.algo;
    return ZR_OK;
}

/* q's descriptors for plan p with epilogue e, and their algorithm; on failure q holds a part. */
static zr_status lt_plan_build(zr_blas *b, lt_plan *q, const zr_gemm_plan *p, const zr_gemm_epi *e,
                               const int align[4])
{
    cudaDataType t = b->type == ZR_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
    /* plain fp32 for fp32 operands (TF32 only with CUBLAS_COMPUTE_32F_FAST_TF32) */
    ZR_LT_CHECK(b, cublasLtMatmulDescCreate(&q->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t ta = p->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint32_t epi = lt_epilogue(e->kind);
    int64_t ldaux = e->ldaux;
    LT_SET(b, q->desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
    LT_SET(b, q->desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
    LT_SET(b, q->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    if (e->bias != NULL) { /* the heuristic reads its alignment */
        LT_SET(b, q->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, e->bias);
    }
    if (e->aux != NULL) {
        LT_SET(b, q->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, e->aux);
        LT_SET(b, q->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ldaux);
    }
    /* each operand as stored, column-major: rows x cols at its ld */
    ZR_LT_CHECK(b, cublasLtMatrixLayoutCreate(&q->la, t, (uint64_t)(p->transa ? p->k : p->m),
                                              (uint64_t)(p->transa ? p->m : p->k), p->lda));
    ZR_LT_CHECK(b, cublasLtMatrixLayoutCreate(&q->lb, t, (uint64_t)(p->transb ? p->n : p->k),
                                              (uint64_t)(p->transb ? p->k : p->n), p->ldb));
    ZR_LT_CHECK(b, cublasLtMatrixLayoutCreate(&q->lc, t, (uint64_t)p->m, (uint64_t)p->n, p->ldc));
    return lt_choose(b, q, align);
}

/* The plan of key: kept from an earlier call, or built now (replacing the oldest when full). */
static zr_status lt_plan_get(zr_blas *b, const int key[LT_KEY], const zr_gemm_plan *p,
                             const zr_gemm_epi *e, lt_plan **out)
{
    lt_plan *q = NULL;
    for (int i = LT_PLANS - 1; i >= 0; i--) {
        if (b->plans[i].used && memcmp(b->plans[i].key, key, sizeof b->plans[i].key) == 0) {
            *out = &b->plans[i];
            return ZR_OK;
        }
        q = b->plans[i].used ? q : &b->plans[i]; /* the first free one */
    }
    if (q == NULL) {
        q = &b->plans[b->evict];
        b->evict = (b->evict + 1) % LT_PLANS;
        lt_plan_clear(b, q);
    }
    const int align[4] = {key[10], key[11], key[12], key[12]};
    zr_status st = lt_plan_build(b, q, p, e, align);
    if (st != ZR_OK) {
        lt_plan_clear(b, q);
        return st;
    }
    memcpy(q->key, key, sizeof q->key);
    q->used = 1;
    *out = q;
    return ZR_OK;
}

/* e as a plain GEMM and the element-wise kernel, where cuBLASLt has no algorithm for it. */
static zr_status epi_unfused(zr_blas *b, const zr_gemm *g, const zr_gemm_epi *e, const void *A,
                             const void *B, void *C)
{
    if (g->ldc != g->N || (e->aux != NULL && e->ldaux != g->N)) {
        ZR_FAIL(ZR_ERR_DEVICE,
                "gemm epilogue %d: cuBLASLt has no algorithm for M %d N %d K %d, and the unfused "
                "path needs rows without gaps (ldc %d, ldaux %d, N %d)",
                (int)e->kind, g->M, g->N, g->K, g->ldc, e->ldaux, g->N);
    }
    switch (e->kind) {
    case ZR_GEMM_EPI_BIAS:
        ZR_CHECK(zr_blas_gemm(b, g, A, B, C));
        return zr_ops_cuda.bias_add(b->type, C, e->bias, g->M, g->N, b->s);
    case ZR_GEMM_EPI_BIAS_GELU:
        ZR_CHECK(zr_blas_gemm(b, g, A, B, e->aux));
        return zr_ops_cuda.bias_gelu_fwd(b->type, C, e->aux, e->bias, g->M, g->N, b->s);
    case ZR_GEMM_EPI_DGELU:
        ZR_CHECK(zr_blas_gemm(b, g, A, B, C));
        return zr_ops_cuda.gelu_bwd(b->type, C, e->aux, C, (size_t)g->M * (size_t)g->N, b->s);
    default:
        return zr_blas_gemm(b, g, A, B, C);
    }
}

zr_status zr_blas_gemm_epi(zr_blas *b, const zr_gemm *g, const zr_gemm_epi *e, const void *A,
                           const void *B, void *C)
{
    zr_gemm_plan p;
    ZR_CHECK(zr_gemm_plan_make(g, &p));
    ZR_CHECK(epi_check(g, e));
    ZR_CHECK(lt_setup(b));
    /* cuBLASLt's A is the row-major B (zr_gemm_plan_make's reasoning) */
    const int key[LT_KEY] = {p.transa,
                             p.transb,
                             p.m,
                             p.n,
                             p.k,
                             p.lda,
                             p.ldb,
                             p.ldc,
                             (int)e->kind,
                             e->ldaux,
                             align_of(B),
                             align_of(A),
                             align_of(C),
                             align_of(e->bias),
                             align_of(e->aux),
                             0};
    lt_plan *q;
    ZR_CHECK(lt_plan_get(b, key, &p, e, &q));
    if (q->unfused) {
        return epi_unfused(b, g, e, A, B, C);
    }
    if (e->bias != NULL) {
        LT_SET(b, q->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, e->bias);
    }
    if (e->aux != NULL) {
        LT_SET(b, q->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, e->aux);
    }
    ZR_LT_CHECK(b, cublasLtMatmul(b->lth, q->desc, &p.alpha, B, q->la, A, q->lb, &p.beta, C, q->lc,
                                  C, q->lc, &q->algo, b->ws, LT_WORKSPACE, zr_stream_cuda(b->s)));
    return ZR_OK;
}
