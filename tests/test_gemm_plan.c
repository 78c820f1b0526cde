/*
 * test_gemm_plan.c - the row-major -> cuBLAS plan of zr's matrix products
 * (zr_gemm_plan_make, zr/model_cuda.h) against a naive GEMM, and the
 * products through cuBLAS on a device.
 *
 *   plan     on the CPU, always: a naive column-major GEMM with cuBLAS'
 *            semantics, called with the plan's arguments (transposes, m n k,
 *            leading dimensions, batch strides, operands swapped) on the
 *            row-major data, gives exactly the naive row-major product: the
 *            same products summed in the same order, so the same bits. Every
 *            transpose pair, odd sizes, padded leading dimensions, batches
 *            with gaps between entries, alpha and beta; padding is never
 *            written. Bad arguments are refused with the field named.
 *   device   where a CUDA device answers (the emulator's cuBLAS on OpenBLAS,
 *            or a GPU): zr_blas_gemm in fp32 within 1e-5 of the exact
 *            product's magnitude (sum of |alpha a b| + |beta c|), bf16
 *            within one bf16 step (2^-7 relative) plus that, the
 *            batched call too; padding untouched.
 *
 * Without a device the second part says so and the first still runs; with
 * --gpu (suite gpu) the program is skipped where no GPU answers.
 */
#include "test.h"
#include "zr/model_cuda.h"

/* row-major op(X)[r][c] of a stored X with leading dimension ld */
static float at(const float *x, int t, int ld, int r, int c)
{
    return t ? x[(size_t)c * ld + r] : x[(size_t)r * ld + c];
}

/* The definition: C = alpha op(A) op(B) + beta C, row-major, per batch entry. */
static void naive_rowmajor(const zr_gemm *g, const float *A, const float *B, float *C)
{
    for (int e = 0; e < g->batch; e++) {
        const float *a = A + e * g->stride_a, *b = B + e * g->stride_b;
        float *c = C + e * g->stride_c;
        for (int i = 0; i < g->M; i++) {
            for (int j = 0; j < g->N; j++) {
                float acc = 0.0f;
                for (int k = 0; k < g->K; k++) {
                    acc += at(a, g->ta, g->lda, i, k) * at(b, g->tb, g->ldb, k, j);
                }
                float *cij = &c[(size_t)i * g->ldc + j];
                *cij = g->alpha * acc + g->beta * *cij;
            }
        }
    }
}

/* cuBLAS' semantics: column-major, op by transa/transb, on the plan's operands. */
static void naive_colmajor(const zr_gemm_plan *p, const float *A, const float *B, float *C)
{
    for (int e = 0; e < p->batch; e++) {
        const float *a = A + e * p->stride_a, *b = B + e * p->stride_b;
        float *c = C + e * p->stride_c;
        for (int j = 0; j < p->n; j++) {
            for (int i = 0; i < p->m; i++) {
                float acc = 0.0f;
                for (int k = 0; k < p->k; k++) {
                    float x = p->transa ? a[(size_t)i * p->lda + k] : a[(size_t)k * p->lda + i];
                    float y = p->transb ? b[(size_t)k * p->ldb + j] : b[(size_t)j * p->ldb + k];
                    acc += x * y;
                }
                float *cij = &c[(size_t)j * p->ldc + i];
                *cij = p->alpha * acc + p->beta * *cij;
            }
        }
    }
}

/* Elements a batch of stored operands spans: rows at ld, entries at stride (+1: never 0). */
static size_t span(int rows, int ld, long long stride, int batch)
{
    return (size_t)(batch - 1) * (size_t)stride + (size_t)rows * (size_t)ld + 1;
}

typedef struct operands {
    float *A, *B, *C;
    size_t na, nb, nc;
} operands;

/* Random operands for g (padding filled with a sentinel in C). */
static void make_operands(const zr_gemm *g, zr_test_rng *rng, operands *o)
{
    int ar = g->ta ? g->K : g->M, br = g->tb ? g->N : g->K;
    o->na = span(ar, g->lda, g->stride_a, g->batch);
    o->nb = span(br, g->ldb, g->stride_b, g->batch);
    o->nc = span(g->M, g->ldc, g->stride_c, g->batch);
    o->A = malloc(o->na * sizeof(float));
    o->B = malloc(o->nb * sizeof(float));
    o->C = malloc(o->nc * sizeof(float));
    for (size_t i = 0; i < o->na; i++) {
        o->A[i] = zr_test_rng_uniform(rng);
    }
    for (size_t i = 0; i < o->nb; i++) {
        o->B[i] = zr_test_rng_uniform(rng);
    }
    for (size_t i = 0; i < o->nc; i++) {
        o->C[i] = zr_test_rng_uniform(rng);
    }
}

static void free_operands(operands *o)
{
    free(o->A);
    free(o->B);
    free(o->C);
}

/* A list of products: every transpose pair over odd sizes, padding and batches. */
static int make_case(int idx, zr_gemm *g)
{
    static const int sizes[][3] = {{1, 1, 1},   {3, 5, 7}, {7, 2, 9}, {16, 17, 5},
                                   {5, 33, 16}, {1, 9, 4}, {8, 1, 3}, {4, 6, 0}};
    const int ns = (int)(sizeof sizes / sizeof sizes[0]);
    if (idx >= ns * 4 * 3) {
        return 0;
    }
    int s = idx / 12, t = (idx / 3) % 4, v = idx % 3;
    memset(g, 0, sizeof *g);
    g->ta = t & 1;
    g->tb = (t >> 1) & 1;
    g->M = sizes[s][0];
    g->N = sizes[s][1];
    g->K = sizes[s][2];
    int pad = v == 0 ? 0 : v + 1;
    g->lda = (g->ta ? g->M : g->K) + pad;
    g->ldb = (g->tb ? g->K : g->N) + pad;
    g->ldc = g->N + pad;
    g->lda = g->lda < 1 ? 1 : g->lda; /* K = 0: rows of nothing, ld still >= 1 */
    g->ldb = g->ldb < 1 ? 1 : g->ldb;
    g->batch = v == 2 ? 3 : 1;
    if (g->batch > 1) { /* gaps between the entries */
        g->stride_a = (long long)(g->ta ? g->K : g->M) * g->lda + 5;
        g->stride_b = (long long)(g->tb ? g->N : g->K) * g->ldb + 3;
        g->stride_c = (long long)g->M * g->ldc + 7;
    }
    g->alpha = v == 1 ? -0.75f : 1.0f;
    g->beta = v == 0 ? 0.0f : 0.5f;
    return 1;
}

static void test_plan_matches_naive(void)
{
    zr_test_rng rng = {42};
    zr_gemm g;
    int cases = 0;
    for (int idx = 0; make_case(idx, &g); idx++, cases++) {
        operands o;
        make_operands(&g, &rng, &o);
        float *ref = malloc(o.nc * sizeof(float));
        memcpy(ref, o.C, o.nc * sizeof(float));
        naive_rowmajor(&g, o.A, o.B, ref);
        zr_gemm_plan p;
        TEST_OK(zr_gemm_plan_make(&g, &p));
        naive_colmajor(&p, o.B, o.A, o.C); /* cuBLAS' A is the row-major B */
        TEST_CHECKF(memcmp(ref, o.C, o.nc * sizeof(float)) == 0,
                    "case %d: ta %d tb %d M %d N %d K %d lda %d ldb %d ldc %d batch %d: the plan's "
                    "column-major product differs from the row-major one",
                    idx, g.ta, g.tb, g.M, g.N, g.K, g.lda, g.ldb, g.ldc, g.batch);
        free(ref);
        free_operands(&o);
    }
    TEST_CHECK(cases == 96);
}

static void test_plan_refuses(void)
{
    zr_gemm_plan p;
    zr_gemm g = {.M = 4, .N = 3, .K = 5, .lda = 5, .ldb = 3, .ldc = 3, .batch = 1, .alpha = 1};
    TEST_OK(zr_gemm_plan_make(&g, &p));
    TEST_EQ_INT(p.m, 3);
    TEST_EQ_INT(p.n, 4);
    TEST_EQ_INT(p.lda, 3);
    TEST_EQ_INT(p.ldb, 5);
    TEST_EQ_INT(p.transa, 0);
    TEST_EQ_INT(p.transb, 0);
    zr_gemm bad = g;
    bad.lda = 4;
    TEST_FAILS(zr_gemm_plan_make(&bad, &p), ZR_ERR_INVALID, "lda 4");
    bad = g;
    bad.ta = 1; /* A stored [K, M]: rows of 4 */
    TEST_OK(zr_gemm_plan_make(&bad, &p));
    TEST_EQ_INT(p.transb, 1);
    bad.lda = 3;
    TEST_FAILS(zr_gemm_plan_make(&bad, &p), ZR_ERR_INVALID, "shorter than a stored row");
    bad = g;
    bad.ldc = 2;
    TEST_FAILS(zr_gemm_plan_make(&bad, &p), ZR_ERR_INVALID, "ldc 2");
    bad = g;
    bad.batch = 0;
    TEST_FAILS(zr_gemm_plan_make(&bad, &p), ZR_ERR_INVALID, "batch 0");
    bad = g;
    bad.K = -1;
    TEST_FAILS(zr_gemm_plan_make(&bad, &p), ZR_ERR_INVALID, "K -1");
    bad = g;
    bad.stride_b = -2;
    TEST_FAILS(zr_gemm_plan_make(&bad, &p), ZR_ERR_INVALID, "strides must be >= 0");
}

/* ---- on the device ------------------------------------------------------------------ */

static zr_device gpu;
static zr_stream *st;
static int have_gpu;

static uint16_t bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* The product on the device in `type`, checked against the naive one within the bound. */
static void device_case(int idx, const zr_gemm *g, zr_dtype type, zr_blas *blas, zr_test_rng *rng)
{
    operands o;
    make_operands(g, rng, &o);
    size_t es = zr_dtype_size(type);
    if (type == ZR_DTYPE_BF16) { /* the inputs as bf16 holds them, for both sides */
        float *xs[3] = {o.A, o.B, o.C};
        size_t ns[3] = {o.na, o.nb, o.nc};
        for (int k = 0; k < 3; k++) {
            for (size_t i = 0; i < ns[k]; i++) {
                xs[k][i] = bf16_widen(bf16_round(xs[k][i]));
            }
        }
    }
    /* the bound's magnitude: the same product on absolute values */
    zr_gemm ga = *g;
    ga.alpha = fabsf(g->alpha);
    ga.beta = fabsf(g->beta);
    operands oa = {malloc(o.na * 4), malloc(o.nb * 4), malloc(o.nc * 4), o.na, o.nb, o.nc};
    for (size_t i = 0; i < o.na; i++) {
        oa.A[i] = fabsf(o.A[i]);
    }
    for (size_t i = 0; i < o.nb; i++) {
        oa.B[i] = fabsf(o.B[i]);
    }
    for (size_t i = 0; i < o.nc; i++) {
        oa.C[i] = fabsf(o.C[i]);
    }
    naive_rowmajor(&ga, oa.A, oa.B, oa.C);
    void *host[3] = {malloc(o.na * es), malloc(o.nb * es), malloc(o.nc * es)};
    float *xs[3] = {o.A, o.B, o.C};
    size_t ns[3] = {o.na, o.nb, o.nc};
    void *dev[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < ns[k]; i++) {
            if (type == ZR_DTYPE_BF16) {
                ((uint16_t *)host[k])[i] = bf16_round(xs[k][i]);
            } else {
                ((float *)host[k])[i] = xs[k][i];
            }
        }
        TEST_OK(zr_device_alloc_at(&gpu, &dev[k], ns[k] * es, __FILE__, __LINE__));
        TEST_OK(zr_memcpy_async(dev[k], host[k], ns[k] * es, st));
    }
    naive_rowmajor(g, o.A, o.B, o.C);
    TEST_OK(zr_blas_gemm(blas, g, dev[0], dev[1], dev[2]));
    TEST_OK(zr_memcpy_async(host[2], dev[2], o.nc * es, st));
    TEST_OK(zr_stream_sync(st));
    double worst = 0.0;
    int bad = 0;
    for (size_t i = 0; i < o.nc; i++) {
        float got =
            type == ZR_DTYPE_BF16 ? bf16_widen(((uint16_t *)host[2])[i]) : ((float *)host[2])[i];
        float want = type == ZR_DTYPE_BF16 ? bf16_widen(bf16_round(o.C[i])) : o.C[i];
        double tol = 1e-5 * oa.C[i] + (type == ZR_DTYPE_BF16 ? fabs(o.C[i]) / 128.0 : 0.0);
        double err = fabs((double)got - (double)want);
        if (!(err <= tol)) { /* padding: both unchanged, so err 0 there */
            bad++;
        }
        worst = err > worst ? err : worst;
    }
    TEST_CHECKF(bad == 0,
                "device %s case %d (ta %d tb %d M %d N %d K %d batch %d): %d elements "
                "outside the bound, worst error %.3g",
                zr_dtype_name(type), idx, g->ta, g->tb, g->M, g->N, g->K, g->batch, bad, worst);
    for (int k = 0; k < 3; k++) {
        zr_device_free(&gpu, dev[k]);
        free(host[k]);
    }
    free_operands(&o);
    free_operands(&oa);
}

static void test_device_products(void)
{
    zr_test_rng rng = {7};
    for (int t = 0; t < 2; t++) {
        zr_dtype type = t ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
        zr_blas *blas = NULL;
        TEST_OK(zr_blas_create(st, type, &blas));
        if (blas == NULL) {
            return;
        }
        zr_gemm g;
        for (int idx = 0; make_case(idx, &g); idx++) {
            device_case(idx, &g, type, blas, &rng);
        }
        zr_blas_destroy(blas);
    }
    zr_blas *b = NULL;
    TEST_FAILS(zr_blas_create(st, (zr_dtype)7, &b), ZR_ERR_INVALID, "neither fp32 nor bf16");
    zr_device cpu = zr_device_cpu();
    zr_stream *cs = NULL;
    TEST_OK(zr_stream_create(&cpu, &cs));
    TEST_FAILS(zr_blas_create(cs, ZR_DTYPE_F32, &b), ZR_ERR_INVALID, "a CPU stream");
    zr_stream_destroy(cs);
}

int main(int argc, char **argv)
{
    int gpu_suite = 0;
    for (int i = 1; i < argc; i++) {
        gpu_suite |= strcmp(argv[i], "--gpu") == 0;
    }
    int n = 0;
    have_gpu = zr_device_cuda_count(&n) == ZR_OK && n > 0;
    char why[256];
    snprintf(why, sizeof why, "%s", have_gpu ? "" : zr_error_message());
    if (!have_gpu && gpu_suite) {
        return zr_test_skip("%s", why);
    }
    TEST_RUN(test_plan_matches_naive);
    TEST_RUN(test_plan_refuses);
    if (have_gpu) {
        zr_error_clear();
        TEST_OK(zr_device_open_cuda(0, &gpu));
        TEST_OK(zr_stream_create(&gpu, &st));
        if (st != NULL) {
            TEST_RUN(test_device_products);
            zr_stream_destroy(st);
        }
    } else {
        printf("  device products not run: %s\n", why);
    }
    return zr_test_finish();
}
