/*
 * test_gpu_gemm_epi.c - products with epilogues through cuBLASLt
 * (zr_blas_gemm_epi, zr/model_cuda.h) against the CPU operators, and against
 * the unfused device path (zr_blas_gemm and the element-wise kernels).
 *
 * Runs on whatever CUDA device answers: the GPU emulator's (suite emu, whose
 * cuBLASLt is tests/emu/cublaslt.cpp) or a real GPU (suite gpu); without one
 * it prints one line saying why and counts as skipped.
 *
 *   epilogues  BIAS, BIAS_GELU (C and the kept GELU input aux), DGELU, and
 *              none, each with the transposes the model uses ((0,1) forward,
 *              (0,0) dX, (1,0) dW), over odd shapes: M, K any (1, 5, 7, 19,
 *              33), N odd for BIAS and none; N a multiple of 8 where there is
 *              an aux (cuBLASLt wants its row stride a multiple of 8; it is
 *              given here with 8 spare columns, which must stay as they
 *              were). fp32: within 1e-5 of the largest reference magnitude
 *              (zr_op_sgemm, zr_op_bias_gelu_fwd, zr_op_gelu_bwd add in other
 *              orders); bf16 (inputs rounded to bf16 for the reference too):
 *              within 1e-2 of it.
 *   unfused    the same BIAS_GELU and DGELU products through zr_blas_gemm +
 *              the CUDA operators bias_gelu_fwd / gelu_bwd: fp32 within
 *              1e-5; a second fused call of a kept shape gives the same bits.
 *   no algo    (emulator: ZR_EMU_LT_NO_ALGO=1, its heuristic finds none) the
 *              epilogues fall back to the plain GEMM + kernel, same bounds;
 *              an aux with spare columns is then refused (ZR_ERR_DEVICE).
 *   arguments  an aux row stride not a multiple of 8 or below N, beta != 0
 *              with an epilogue, batch 2, a NULL bias: ZR_ERR_INVALID naming
 *              the problem.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */

#include "test.h"
#include "test_gpu.h"
#include "zr/gpt_engine.h"
#include "zr/model_cuda.h"

#include "../src/model/ops.h"       /* the CPU operators: internal to src/model */
#include "../src/model/ops_table.h" /* the devices' operators: internal to src/model */

/* Random values of amplitude amp, as storage type t holds them. */
/* The CUDA backend's operators (set by main). */
static const zr_op_table *ops;

static float *rand_buf(zr_test_rng *rng, size_t n, float amp, zr_dtype t)
{
    float *x = malloc(n * sizeof *x + 4);
    for (size_t i = 0; i < n; i++) {
        x[i] = amp * zr_test_rng_uniform(rng);
        x[i] = t == ZR_DTYPE_BF16 ? zr_bf16_to_f32(zr_bf16_from_f32(x[i])) : x[i];
    }
    return x;
}

/* Elements of got [M, N] (row stride ld) beyond tol of want's largest magnitude. */
static int count_bad(const float *got, const float *want, int M, int N, int ld, double tol)
{
    double big = 0.0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double w = fabs(want[(size_t)i * ld + j]);
            big = w > big ? w : big;
        }
    }
    int bad = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            size_t k = (size_t)i * ld + j;
            bad += !(fabs((double)got[k] - want[k]) <= tol * (big > 0 ? big : 1.0));
        }
    }
    return bad;
}

typedef struct epi_case {
    zr_gemm_epilogue kind;
    int ta, tb, M, N, K;
} epi_case;

static const char *const kind_name[] = {"none", "bias", "bias+gelu", "dgelu"};

/* One product with epilogue on the device against the CPU operators. */
static void epi_vs_cpu(zr_blas *b, const epi_case *c, zr_dtype t, uint64_t seed, int spare)
{
    const int M = c->M, N = c->N, K = c->K, ldaux = N + spare;
    const int lda = c->ta ? M : K, ldb = c->tb ? K : N;
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N, nx = (size_t)M * ldaux;
    zr_test_rng rng = {seed};
    float *A = rand_buf(&rng, na, 1.0f, t), *B = rand_buf(&rng, nb, 1.0f, t);
    float *bias = rand_buf(&rng, (size_t)N, 0.5f, t), *aux = rand_buf(&rng, nx, 2.0f, t);
    float *want = malloc(nc * 4), *got = calloc(nc, 4), *want_aux = malloc(nx * 4);
    float *got_aux = malloc(nx * 4);
    memcpy(want_aux, aux, nx * 4);
    zr_op_sgemm(c->ta, c->tb, M, N, K, A, lda, B, ldb, 0.0f, want, N);
    if (c->kind == ZR_GEMM_EPI_BIAS) {
        for (size_t i = 0; i < nc; i++) {
            want[i] += bias[i % (size_t)N];
        }
    } else if (c->kind == ZR_GEMM_EPI_BIAS_GELU) {
        float *pre = malloc(nc * 4);
        memcpy(pre, want, nc * 4);
        zr_op_bias_gelu_fwd(want, pre, bias, M, N);
        for (int i = 0; i < M; i++) {
            memcpy(want_aux + (size_t)i * ldaux, pre + (size_t)i * N, (size_t)N * 4);
        }
        free(pre);
    } else if (c->kind == ZR_GEMM_EPI_DGELU) {
        float *pre = malloc(nc * 4);
        for (int i = 0; i < M; i++) {
            memcpy(pre + (size_t)i * N, aux + (size_t)i * ldaux, (size_t)N * 4);
        }
        zr_op_gelu_bwd(want, NULL, pre, want, M, N);
        free(pre);
    }
    void *dA = dput(A, na, t), *dB = dput(B, nb, t), *dC = dput(got, nc, t);
    void *dbias = dput(bias, (size_t)N, t), *daux = dput(aux, nx, t);
    zr_gemm g = {c->ta, c->tb, M, N, K, lda, ldb, N, 0, 0, 0, 1, 1.0f, 0.0f};
    int has_bias = c->kind == ZR_GEMM_EPI_BIAS || c->kind == ZR_GEMM_EPI_BIAS_GELU;
    int has_aux = c->kind == ZR_GEMM_EPI_BIAS_GELU || c->kind == ZR_GEMM_EPI_DGELU;
    zr_gemm_epi e = {c->kind, has_bias ? dbias : NULL, has_aux ? daux : NULL, ldaux};
    if (spare > 0 && has_aux && getenv("ZR_EMU_LT_NO_ALGO") != NULL) {
        TEST_FAILS(zr_blas_gemm_epi(b, &g, &e, dA, dB, dC), ZR_ERR_DEVICE, "rows without gaps");
        memcpy(want, got, nc * 4);
        memcpy(want_aux, aux, nx * 4);
    } else {
        TEST_OK(zr_blas_gemm_epi(b, &g, &e, dA, dB, dC));
    }
    dget(got, dC, nc, t);
    dget(got_aux, daux, nx, t);
    double tol = t == ZR_DTYPE_BF16 ? 1e-2 : 1e-5;
    int bad = count_bad(got, want, M, N, N, tol);
    TEST_CHECKF(bad == 0, "%s %s ta %d tb %d M %d N %d K %d: %d of C beyond %.0e",
                kind_name[c->kind], zr_dtype_name(t), c->ta, c->tb, M, N, K, bad, tol);
    bad = count_bad(got_aux, want_aux, M, ldaux, ldaux, tol); /* spare columns: as they were */
    TEST_CHECKF(bad == 0, "%s %s M %d N %d K %d: %d of aux (with its spare columns) beyond %.0e",
                kind_name[c->kind], zr_dtype_name(t), M, N, K, bad, tol);
    zr_device_free(&gpu, dA), zr_device_free(&gpu, dB), zr_device_free(&gpu, dC);
    zr_device_free(&gpu, dbias), zr_device_free(&gpu, daux);
    free(A), free(B), free(bias), free(aux), free(want), free(got), free(want_aux), free(got_aux);
}

static void test_epilogues(void)
{
    static const epi_case cases[] = {
        {ZR_GEMM_EPI_NONE, 0, 1, 7, 13, 9},        {ZR_GEMM_EPI_BIAS, 0, 1, 7, 13, 9},
        {ZR_GEMM_EPI_BIAS, 0, 1, 33, 50, 19},      {ZR_GEMM_EPI_BIAS, 0, 0, 5, 3, 1},
        {ZR_GEMM_EPI_BIAS, 1, 0, 19, 24, 7},       {ZR_GEMM_EPI_BIAS_GELU, 0, 1, 5, 24, 7},
        {ZR_GEMM_EPI_BIAS_GELU, 0, 1, 33, 16, 19}, {ZR_GEMM_EPI_BIAS_GELU, 0, 0, 1, 8, 1},
        {ZR_GEMM_EPI_DGELU, 0, 0, 7, 24, 5},       {ZR_GEMM_EPI_DGELU, 0, 0, 33, 16, 19},
        {ZR_GEMM_EPI_DGELU, 0, 1, 19, 40, 33},
    };
    const zr_dtype types[] = {ZR_DTYPE_F32, ZR_DTYPE_BF16};
    for (int ti = 0; ti < 2; ti++) {
        zr_blas *b = NULL;
        TEST_OK(zr_blas_create(st, types[ti], &b));
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            epi_vs_cpu(b, &cases[i], types[ti], 100 + i, 8);
        }
        zr_blas_destroy(b);
    }
}

/* BIAS_GELU then DGELU fused, and through zr_blas_gemm + the element-wise kernels (fp32). */
#if ZR_CUDA_EMU
/* The epilogues again where cuBLASLt's heuristic finds no algorithm (the emulator's knob). */
static void test_no_algorithm(void)
{
    TEST_OK(setenv("ZR_EMU_LT_NO_ALGO", "1", 1) == 0 ? ZR_OK : ZR_ERR_INVALID);
    static const epi_case cases[] = {
        {ZR_GEMM_EPI_BIAS, 0, 1, 7, 13, 9},
        {ZR_GEMM_EPI_BIAS_GELU, 0, 1, 33, 16, 19},
        {ZR_GEMM_EPI_DGELU, 0, 0, 7, 24, 5},
    };
    zr_blas *b = NULL;
    TEST_OK(zr_blas_create(st, ZR_DTYPE_F32, &b));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        epi_vs_cpu(b, &cases[i], ZR_DTYPE_F32, 200 + i, 0);
    }
    /* the unfused kernels need rows without gaps: an aux with spare columns is refused */
    epi_case gap = {ZR_GEMM_EPI_BIAS_GELU, 0, 1, 5, 8, 3};
    epi_vs_cpu(b, &gap, ZR_DTYPE_F32, 300, 8);
    zr_blas_destroy(b);
    TEST_OK(unsetenv("ZR_EMU_LT_NO_ALGO") == 0 ? ZR_OK : ZR_ERR_INVALID);
}
#endif

static void test_fused_vs_unfused(void)
{
    const int M = 19, N = 32, K = 24;
    const size_t nc = (size_t)M * N;
    zr_test_rng rng = {7};
    float *x = rand_buf(&rng, (size_t)M * K, 1.0f, ZR_DTYPE_F32);
    float *w = rand_buf(&rng, (size_t)N * K, 1.0f, ZR_DTYPE_F32);
    float *bias = rand_buf(&rng, (size_t)N, 0.5f, ZR_DTYPE_F32);
    float *dy = rand_buf(&rng, (size_t)M * K, 1.0f, ZR_DTYPE_F32);
    float *f[4], *u[4];
    for (int i = 0; i < 4; i++) {
        f[i] = malloc(nc * 4), u[i] = malloc(nc * 4);
    }
    zr_blas *b = NULL;
    TEST_OK(zr_blas_create(st, ZR_DTYPE_F32, &b));
    void *dx = dput(x, (size_t)M * K, ZR_DTYPE_F32), *dw = dput(w, (size_t)N * K, ZR_DTYPE_F32);
    void *dbias = dput(bias, (size_t)N, ZR_DTYPE_F32), *ddy = dput(dy, (size_t)M * K, ZR_DTYPE_F32);
    void *pre = dput(f[0], nc, ZR_DTYPE_F32), *out = dput(f[0], nc, ZR_DTYPE_F32);
    /* forward: out = GELU(x w^T + bias), pre kept; backward: d = (dy w^T... as [M, N]) GELU'(pre)
     */
    zr_gemm fw = {0, 1, M, N, K, K, K, N, 0, 0, 0, 1, 1.0f, 0.0f};
    zr_gemm bw = {0, 1, M, N, K, K, K, N, 0, 0, 0, 1, 1.0f, 0.0f};
    for (int fused = 1; fused >= 0; fused--) {
        float **r = fused ? f : u;
        if (fused) {
            zr_gemm_epi e = {ZR_GEMM_EPI_BIAS_GELU, dbias, pre, N};
            TEST_OK(zr_blas_gemm_epi(b, &fw, &e, dx, dw, out));
        } else {
            TEST_OK(zr_blas_gemm(b, &fw, dx, dw, pre));
            TEST_OK(ops->bias_gelu_fwd(ZR_DTYPE_F32, out, pre, dbias, M, N, st));
        }
        dget(r[0], out, nc, ZR_DTYPE_F32);
        dget(r[1], pre, nc, ZR_DTYPE_F32);
        if (fused) {
            zr_gemm_epi e = {ZR_GEMM_EPI_DGELU, NULL, pre, N};
            TEST_OK(zr_blas_gemm_epi(b, &bw, &e, ddy, dw, out));
        } else {
            TEST_OK(zr_blas_gemm(b, &bw, ddy, dw, out));
            TEST_OK(ops->gelu_bwd(ZR_DTYPE_F32, out, pre, out, nc, st));
        }
        dget(r[2], out, nc, ZR_DTYPE_F32);
    }
    static const char *const what[] = {"GELU output", "GELU input", "GELU backward"};
    for (int i = 0; i < 3; i++) {
        int bad = count_bad(f[i], u[i], M, N, N, 1e-5);
        TEST_CHECKF(bad == 0, "%s: %d elements differ fused vs unfused beyond 1e-5", what[i], bad);
    }
    /* the kept plan again: the same bits */
    zr_gemm_epi e = {ZR_GEMM_EPI_DGELU, NULL, pre, N};
    TEST_OK(zr_blas_gemm_epi(b, &bw, &e, ddy, dw, out));
    dget(f[3], out, nc, ZR_DTYPE_F32);
    TEST_CHECK(memcmp(f[3], f[2], nc * 4) == 0);
    void *bufs[] = {dx, dw, dbias, ddy, pre, out};
    for (int i = 0; i < 6; i++) {
        zr_device_free(&gpu, bufs[i]);
    }
    for (int i = 0; i < 4; i++) {
        free(f[i]), free(u[i]);
    }
    free(x), free(w), free(bias), free(dy);
    zr_blas_destroy(b);
}

static void test_arguments(void)
{
    zr_blas *b = NULL;
    TEST_OK(zr_blas_create(st, ZR_DTYPE_F32, &b));
    void *d = NULL;
    TEST_OK(zr_device_alloc_at(&gpu, &d, 4096, __FILE__, __LINE__));
    zr_gemm g = {0, 1, 4, 16, 4, 4, 4, 16, 0, 0, 0, 1, 1.0f, 0.0f};
    zr_gemm_epi e = {ZR_GEMM_EPI_BIAS_GELU, d, d, 20};
    TEST_FAILS(zr_blas_gemm_epi(b, &g, &e, d, d, d), ZR_ERR_INVALID, "multiple of 8");
    e.ldaux = 8;
    TEST_FAILS(zr_blas_gemm_epi(b, &g, &e, d, d, d), ZR_ERR_INVALID, "must be >= N = 16");
    e.ldaux = 16;
    e.bias = NULL;
    TEST_FAILS(zr_blas_gemm_epi(b, &g, &e, d, d, d), ZR_ERR_INVALID, "the bias pointer is NULL");
    e.bias = d;
    g.beta = 1.0f;
    TEST_FAILS(zr_blas_gemm_epi(b, &g, &e, d, d, d), ZR_ERR_INVALID, "beta 0");
    g.beta = 0.0f;
    g.batch = 2;
    TEST_FAILS(zr_blas_gemm_epi(b, &g, &e, d, d, d), ZR_ERR_INVALID, "batch 1");
    zr_device_free(&gpu, d);
    zr_blas_destroy(b);
}

int main(void)
{
    int n = 0;
    if (zr_device_cuda_count(&n) != ZR_OK) {
        return zr_test_skip("%s", zr_error_message());
    }
    zr_error_clear();
    const zr_gpt_backend_i *be;
    TEST_OK(zr_gpt_backend_of(ZR_DEVICE_CUDA, &be));
    ops = be->ops;
    TEST_OK(zr_device_open_cuda(0, &gpu));
    TEST_OK(zr_stream_create(&gpu, &st));
    if (st != NULL) {
        TEST_RUN(test_epilogues);
        TEST_RUN(test_fused_vs_unfused);
#if ZR_CUDA_EMU
        TEST_RUN(test_no_algorithm);
#endif
        TEST_RUN(test_arguments);
    }
    zr_stream_destroy(st);
    return zr_test_finish();
}
