/*
 * ops_gemm.c - the model's matrix products on the CPU: fp32 on OpenBLAS, or
 * bf16 inputs with fp32 accumulation on oneDNN where the CPU has bf16
 * products (src/base/blas.h), each split into bands of rows of C over the
 * process's pool so that the thread count changes no bit.
 *
 * The bf16 mode is what bf16 mixed precision is on a GPU: the product's
 * inputs rounded to bf16 (round to nearest even, src/quant/bf16_rules.h),
 * the sums and the output in fp32; the master weights, the optimizer and
 * every other operator stay fp32. The operand shared by every band (B) is
 * rounded once, into the products' scratch; each band rounds its own rows of
 * op(A) into its thread's scratch, so that a product over a vocabulary-wide
 * A (the classifier's backward) never needs a whole bf16 copy of it.
 */
#include "ops.h"

#include "zr/base.h"
#include "zr/pool.h"

#include "../base/blas.h"
#include "../quant/bf16_rules.h"

#include <string.h>

/*
 * Matrix products: each thread computes a band of rows of C with its own
 * single-threaded cblas_sgemm (OpenBLAS's threads stay at 1), so the
 * summed dimension is blocked the same way whatever the thread count, which
 * OpenBLAS's own threading does not promise (it blocks K differently with
 * more threads). The band edges matter too: OpenBLAS's x86 kernels walk the
 * rows of a row-major C in blocks of 12 (Haswell, Zen) or 24 (SkylakeX)
 * with narrower remainder paths that round differently, so bands are whole
 * multiples of ZR_GEMM_ROWS = 24 rows and every row runs through the same
 * code as in a single call. Each band holds at least ZR_GEMM_GRAIN
 * multiply-adds, which also keeps split products out of the small-matrix
 * kernels (up to 10^6 multiply-adds). test_model checks the bits at 1, 2
 * and 3 threads on whatever machine runs it.
 */
#define ZR_GEMM_ROWS  24
#define ZR_GEMM_GRAIN (1 << 22)

typedef struct gemm_args {
    int ta, tb, M, N, K, lda, ldb, ldc;
    float beta;
    const float *A, *B;
    float *C;
    const zr_blas *blas;
} gemm_args;

static void gemm_task(void *arg, size_t b0, size_t b1, int thread)
{
    const gemm_args *g = arg;
    (void)thread;
    size_t m0 = b0 * ZR_GEMM_ROWS,
           m1 = b1 * ZR_GEMM_ROWS < (size_t)g->M ? b1 * ZR_GEMM_ROWS : (size_t)g->M;
    /* row m of op(A) starts at A + m * lda, or at column m of A when transposed */
    const float *A = g->ta ? g->A + m0 : g->A + m0 * (size_t)g->lda;
    g->blas->cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans,
                         g->tb ? CblasTrans : CblasNoTrans, (int)(m1 - m0), g->N, g->K, 1.0f, A,
                         g->lda, g->B, g->ldb, g->beta, g->C + m0 * (size_t)g->ldc, g->ldc);
}

void zr_op_sgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
                 int ldb, float beta, float *C, int ldc)
{
    gemm_args g = {ta, tb, M, N, K, lda, ldb, ldc, beta, A, B, C, zr_blas_get()};
    size_t per_band = (size_t)ZR_GEMM_ROWS * (size_t)N * (size_t)K;
    size_t grain = per_band >= ZR_GEMM_GRAIN ? 1 : zr_div_up(ZR_GEMM_GRAIN, per_band);
    zr_parallel_for(zr_div_up((size_t)M, ZR_GEMM_ROWS), grain, gemm_task, &g);
}

/* ---- bf16 inputs ------------------------------------------------------------------ */

/*
 * ZR_GEMM_BF16_ROWS (ops.h), the rows of C per bf16 band, is fixed so that a
 * row's product never depends on the thread count (oneDNN blocks the summed
 * dimension by the shape it is given: a band of another height may round
 * differently); a multiple of AMX's 16 tile rows, and tall enough that
 * re-packing B per band stays cheap.
 */

typedef struct round_args {
    uint16_t *dst;
    const float *src;
    size_t cols, ld; /* per row: cols elements of src at row * ld, packed in dst */
} round_args;

static void round_rows(const round_args *r, size_t r0, size_t r1)
{
    for (size_t i = r0; i < r1; i++) {
        const float *s = r->src + i * r->ld;
        uint16_t *d = r->dst + i * r->cols;
        for (size_t c = 0; c < r->cols; c++) {
            d[c] = zr_quant_bf16_round(s[c]);
        }
    }
}

static void round_task(void *arg, size_t r0, size_t r1, int thread)
{
    (void)thread;
    round_rows(arg, r0, r1);
}

typedef struct gemm16_args {
    zr_op_products *p;
    int ta, tb, M, N, K, lda, ldc;
    float beta;
    const float *A;
    float *C;
} gemm16_args;

/* Bands b0..b1 of ZR_GEMM_BF16_ROWS rows: op(A)'s rows rounded, then one product each. */
static void gemm16_task(void *arg, size_t b0, size_t b1, int thread)
{
    const gemm16_args *g = arg;
    zr_op_products *p = g->p;
    uint16_t *a = p->a + (size_t)thread * p->a_per;
    for (size_t b = b0; b < b1; b++) {
        size_t m0 = b * ZR_GEMM_BF16_ROWS, rows = (size_t)g->M - m0;
        rows = rows < ZR_GEMM_BF16_ROWS ? rows : ZR_GEMM_BF16_ROWS;
        int lda;
        if (g->ta) { /* op(A) rows are A's columns m0..: K rows of `rows`, kept transposed */
            round_args r = {a, g->A + m0, rows, (size_t)g->lda};
            round_rows(&r, 0, (size_t)g->K);
            lda = (int)rows;
        } else {
            round_args r = {a, g->A + m0 * (size_t)g->lda, (size_t)g->K, (size_t)g->lda};
            round_rows(&r, 0, rows);
            lda = g->K;
        }
        if (zr_blas_gemm_bf16(&p->ctx[thread], g->ta, g->tb, (int)rows, g->N, g->K, a, lda, p->b,
                              g->tb ? g->K : g->N, g->beta, g->C + m0 * (size_t)g->ldc,
                              g->ldc) != ZR_OK) {
            zr_die(__FILE__, __LINE__, "ZR_CPU_BF16=0 runs the products in fp32", "%s",
                   zr_error_message());
        }
    }
}

/* Room for the calling pool's threads and a product of this size (between calls only). */
static void products_fit(zr_op_products *p, int threads, size_t a_per, size_t b_numel)
{
    if (threads <= p->threads && a_per <= p->a_per && b_numel <= p->b_cap) {
        return;
    }
    size_t per = a_per > p->a_per ? a_per : p->a_per;
    size_t bn = b_numel > p->b_cap ? b_numel : p->b_cap;
    int nt = threads > p->threads ? threads : p->threads;
    if (zr_op_products_reserve(p, nt, per, bn) != ZR_OK) {
        zr_die(__FILE__, __LINE__, "a smaller micro-batch, or ZR_CPU_BF16=0", "%s",
               zr_error_message());
    }
}

static void gemm_bf16(zr_op_products *p, int ta, int tb, int M, int N, int K, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    size_t brows = tb ? (size_t)N : (size_t)K, bcols = tb ? (size_t)K : (size_t)N;
    size_t band = (size_t)(M < ZR_GEMM_BF16_ROWS ? M : ZR_GEMM_BF16_ROWS);
    products_fit(p, zr_threads_get(), band * (size_t)K, brows * bcols);
    round_args r = {p->b, B, bcols, (size_t)ldb};
    zr_parallel_for(brows, zr_div_up(ZR_GEMM_GRAIN / 16, bcols), round_task, &r);
    gemm16_args g = {p, ta, tb, M, N, K, lda, ldc, beta, A, C};
    zr_parallel_for(zr_div_up((size_t)M, ZR_GEMM_BF16_ROWS), 1, gemm16_task, &g);
}

void zr_op_gemm(zr_op_products *p, int ta, int tb, int M, int N, int K, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc)
{
    if (p != NULL && p->bf16 && M > 0 && N > 0 && K > 0) {
        gemm_bf16(p, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    } else {
        zr_op_sgemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    }
}

/* ---- the products' mode and scratch ---------------------------------------------- */

zr_status zr_op_products_reserve(zr_op_products *p, int threads, size_t a_per, size_t b_numel)
{
    zr_status st = ZR_OK;
    uint16_t *a = NULL, *b = NULL;
    zr_blas_bf16_ctx *ctx = NULL;
    ZR_ASSERT(threads >= 1);
    ZR_ALLOC_GOTO(a, (size_t)threads * a_per, st, fail);
    ZR_ALLOC_GOTO(b, b_numel, st, fail);
    ZR_ALLOC_GOTO(ctx, (size_t)threads, st, fail);
    if (p->ctx != NULL) {
        memcpy(ctx, p->ctx, sizeof *ctx * (size_t)p->threads); /* streams and scratchpads kept */
    }
    zr_free(p->a);
    zr_free(p->b);
    zr_free(p->ctx);
    p->a = a;
    p->b = b;
    p->ctx = ctx;
    p->a_per = a_per;
    p->b_cap = b_numel;
    p->threads = threads;
    return ZR_OK;
fail:
    zr_free(a);
    zr_free(b);
    zr_free(ctx);
    return st;
}

size_t zr_op_products_bytes(const zr_op_products *p)
{
    return p == NULL ? 0 : ((size_t)p->threads * p->a_per + p->b_cap) * sizeof(uint16_t);
}

void zr_op_products_free(zr_op_products *p)
{
    if (p == NULL) {
        return;
    }
    for (int t = 0; t < p->threads && p->ctx != NULL; t++) {
        zr_blas_bf16_ctx_free(&p->ctx[t]);
    }
    zr_free(p->a);
    zr_free(p->b);
    zr_free(p->ctx);
    memset(p, 0, sizeof *p);
}
