/*
 * test_products.c - the model's matrix products on bf16 inputs with fp32
 * accumulation (src/model/ops_gemm.c, src/base/blas_bf16.c), on whatever CPU
 * runs the test: ZR_CPU_BF16=force makes oneDNN run them where the CPU has
 * no bf16 instructions (its own slower kernels), so every check runs on every
 * x86-64, AMD or Intel, and this CPU's own kernels run where it has them.
 *
 *   - zr_blas_bf16_choose on made-up CPUs: AMX or AVX512_BF16 on, AVX-512
 *     alone, AVX2 and a ZR_CPU cap off (saying so), ZR_CPU_BF16 0/off/force,
 *     and a bad value refused by name;
 *   - a bf16 product against the fp64 sum of the bf16-rounded inputs, within
 *     fp32 accumulation's bound ((K + 2) 2^-23 of the sum of |a b|), over odd
 *     shapes, several bands, every transpose, beta 0 and 1, C's spare columns
 *     untouched; an fp32 product of the same inputs is more than 4 bounds off
 *     (so the check can tell that the inputs were rounded);
 *   - the same bits at 1, 2 and 3 threads (several bands of rows);
 *   - the GPT forward and backward with bf16 products against fp32: the loss
 *     within 1e-3 relative, every unit's gradient within 3% of its norm, the
 *     activation bytes counting the scratch as predicted
 *     (zr_gpt_config_products_bytes); ZR_CPU_BF16=0 gives fp32's bits;
 *   - 300 AdamW steps of a small GPT, a fresh batch each step (half its
 *     targets a rule of the input, half random): the bf16 loss within 2% of
 *     fp32's at step 1 and every 50th, while fp32's falls by a fifth or more.
 */
#define _GNU_SOURCE /* setenv */

#include "test.h"
#include "zr/model.h"
#include "zr/optim.h"
#include "zr/pool.h"

#include "../src/base/blas.h"
#include "../src/model/ops.h"
#include "../src/quant/bf16_rules.h"

#include <math.h>

static const zr_cpu_features AVX2 = {ZR_CPU_VENDOR_INTEL, 1, 1, 0, 0, 0};
static const zr_cpu_features SKX = {ZR_CPU_VENDOR_INTEL, 1, 1, 1, 0, 0};
static const zr_cpu_features CPX = {ZR_CPU_VENDOR_INTEL, 1, 1, 1, 1, 0};
static const zr_cpu_features SPR = {ZR_CPU_VENDOR_INTEL, 1, 1, 1, 1, 1};
static const zr_cpu_features ZEN4 = {ZR_CPU_VENDOR_AMD, 1, 1, 1, 1, 0};

static void choice_is(const zr_cpu_features *f, const char *setting, int want, const char *why)
{
    char reason[256];
    int got = zr_blas_bf16_choose(f, setting, reason, sizeof reason);
    TEST_CHECKF(got == want, "setting %s: %d, expected %d (%s)", setting ? setting : "-", got, want,
                reason);
    TEST_CHECKF(strstr(reason, why) != NULL, "reason '%s' lacks '%s'", reason, why);
}

static void test_choose(void)
{
    choice_is(&SPR, NULL, 1, "AMX");
    choice_is(&CPX, NULL, 1, "AVX512_BF16");
    choice_is(&ZEN4, "", 1, "AVX512_BF16");
    choice_is(&SPR, "on", 1, "AMX");
    choice_is(&SKX, NULL, 0, "neither AVX512_BF16 nor AMX");
    choice_is(&AVX2, "1", 0, "fp32 products");
    choice_is(&SPR, "0", 0, "ZR_CPU_BF16=0");
    choice_is(&SPR, "off", 0, "ZR_CPU_BF16=off");
    choice_is(&AVX2, "force", 1, "force");
    choice_is(&SPR, "yes", 0, "ZR_CPU_BF16=yes is not one of");
}

static void fill(float *x, size_t n, zr_test_rng *r)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = zr_test_rng_normal(r);
    }
}

static double rb(float x)
{
    return zr_quant_bf16_widen(zr_quant_bf16_round(x));
}

/* One product of shape (M, N, K, ta, tb, beta) under p against fp64 sums; returns failures. */
static int check_product(zr_op_products *p, int M, int N, int K, int ta, int tb, float beta)
{
    zr_test_rng r = {(uint64_t)(M * 131 + N * 7 + K + ta * 2 + tb + 1)};
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2; /* padded rows */
    size_t an = (size_t)(ta ? K : M) * lda, bn = (size_t)(tb ? N : K) * ldb;
    float *A = malloc(an * 4), *B = malloc(bn * 4), *C = malloc((size_t)M * ldc * 4),
          *C0 = malloc((size_t)M * ldc * 4);
    fill(A, an, &r);
    fill(B, bn, &r);
    fill(C0, (size_t)M * ldc, &r);
    memcpy(C, C0, (size_t)M * ldc * 4);
    zr_op_gemm(p, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < ldc; j++) {
            size_t ij = (size_t)i * ldc + j;
            if (j >= N) {
                bad += memcmp(&C[ij], &C0[ij], 4) != 0; /* spare columns untouched */
                continue;
            }
            double s16 = beta * (double)C0[ij], mag = fabs(s16);
            for (int k = 0; k < K; k++) {
                float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s16 += rb(a) * rb(b);
                mag += fabs((double)a * b);
            }
            double bound = (K + 2) * ldexp(1.0, -23) * mag + 1e-30;
            double e = fabs(C[ij] - s16) / bound;
            worst = e > worst ? e : worst;
        }
    }
    TEST_CHECKF(bad == 0 && worst <= 1.0,
                "%d x %d x %d ta %d tb %d beta %g: %.2f of the bound off the rounded inputs' sum, "
                "%d spare columns changed",
                M, N, K, ta, tb, (double)beta, worst, bad);
    free(A), free(B), free(C), free(C0);
    return bad + (worst > 1.0);
}

static void test_gemm(void)
{
    zr_op_products p = {0};
    TEST_OK(zr_op_products_reserve(&p, 1, 16, 16));
    p.bf16 = 1;
    const int shapes[][3] = {{1, 1, 1}, {37, 29, 53}, {600, 70, 301}, {1100, 33, 17}, {8, 130, 9}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (int t = 0; t < 8; t++) {
            check_product(&p, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, (t >> 1) & 1,
                          (t >> 2) ? 1.0f : 0.0f);
        }
    }
    /* the rounding is real: an fp32 product (p NULL) of the same inputs is off the
       rounded inputs' sums by far more than the bound that holds above */
    zr_test_rng r = {99};
    int M = 64, N = 48, K = 200;
    float *A = malloc((size_t)M * K * 4), *B = malloc((size_t)K * N * 4), *C = malloc(M * N * 4);
    fill(A, (size_t)M * K, &r);
    fill(B, (size_t)K * N, &r);
    zr_op_gemm(NULL, 0, 0, M, N, K, A, K, B, N, 0.0f, C, N);
    double far = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double s16 = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                s16 += rb(A[i * K + k]) * rb(B[k * N + j]);
                mag += fabs((double)A[i * K + k] * B[k * N + j]);
            }
            double d = fabs(C[i * N + j] - s16) / ((K + 2) * ldexp(1.0, -23) * mag);
            far = d > far ? d : far;
        }
    }
    TEST_CHECKF(far > 4.0, "an fp32 product is only %.2f of the bound off the rounded sums", far);
    free(A), free(B), free(C);
    zr_op_products_free(&p);
}

static void test_threads(void)
{
    int M = 1300, N = 40, K = 96;
    zr_test_rng r = {5};
    float *A = malloc((size_t)M * K * 4), *B = malloc((size_t)N * K * 4);
    float *C[3];
    fill(A, (size_t)M * K, &r);
    fill(B, (size_t)N * K, &r);
    zr_op_products p = {0};
    TEST_OK(zr_op_products_reserve(&p, 1, 16, 16)); /* grows with the threads */
    p.bf16 = 1;
    for (int t = 0; t < 3; t++) {
        TEST_OK(zr_threads_set(t + 1));
        C[t] = calloc((size_t)M * N, 4);
        zr_op_gemm(&p, 0, 1, M, N, K, A, K, B, K, 0.0f, C[t], N);
    }
    TEST_CHECKF(p.threads >= 3, "scratch for %d threads after running on 3", p.threads);
    TEST_CHECK(memcmp(C[0], C[1], (size_t)M * N * 4) == 0);
    TEST_CHECK(memcmp(C[0], C[2], (size_t)M * N * 4) == 0);
    TEST_OK(zr_threads_set(1));
    for (int t = 0; t < 3; t++) {
        free(C[t]);
    }
    free(A), free(B);
    zr_op_products_free(&p);
}

/* ---- the model -------------------------------------------------------------------- */

typedef struct gpt_state {
    zr_gpt m;
    int nu;
    float *p[16], *g[16], *mo[16], *vo[16];
} gpt_state;

static const zr_gpt_config SMALL = {64, 250, 256, 2, 4, 64}; /* max_t V Vp L NH C */

static void state_init(gpt_state *s, int B, int T, int bf16, const char *want_why)
{
    memset(s, 0, sizeof *s);
    TEST_OK(zr_gpt_init(&s->m, &SMALL, B, T));
    size_t before = zr_gpt_activation_bytes(&s->m);
    char why[256];
    int got = zr_gpt_set_products(&s->m, bf16, why, sizeof why);
    TEST_CHECKF(got == (bf16 && want_why == NULL), "products %d (%s), asked %d", got, why, bf16);
    TEST_CHECKF(want_why == NULL || strstr(why, want_why) != NULL, "'%s' lacks '%s'", why,
                want_why != NULL ? want_why : "");
    size_t after = zr_gpt_activation_bytes(&s->m);
    size_t want = got == 1 ? zr_gpt_config_products_bytes(&SMALL, B, T, zr_threads_get()) : 0;
    TEST_CHECKF(after - before == want && (got != 1 || want > 0),
                "activation bytes %zu -> %zu with products %d, predicted scratch %zu", before,
                after, got, want);
    s->nu = zr_gpt_unit_count(&s->m);
    for (int u = 0; u < s->nu; u++) {
        size_t n = zr_gpt_unit_numel(&s->m, u);
        s->p[u] = calloc(n, 4), s->g[u] = calloc(n, 4);
        s->mo[u] = calloc(n, 4), s->vo[u] = calloc(n, 4);
        zr_gpt_unit_init_params(&s->m, u, s->p[u], 7);
    }
}

static void state_free(gpt_state *s)
{
    for (int u = 0; u < s->nu; u++) {
        free(s->p[u]), free(s->g[u]), free(s->mo[u]), free(s->vo[u]);
    }
    zr_gpt_free(&s->m);
}

/* Forward and backward (gradients overwritten); returns the loss. */
static float state_grads(gpt_state *s, const int *in, const int *tg)
{
    TEST_OK(zr_gpt_forward_begin(&s->m, in, tg));
    for (int u = 0; u < s->nu; u++) {
        TEST_OK(zr_gpt_forward_unit(&s->m, u, s->p[u], s->p[0]));
        memset(s->g[u], 0, zr_gpt_unit_numel(&s->m, u) * 4);
    }
    TEST_OK(zr_gpt_backward_begin(&s->m));
    for (int u = s->nu - 1; u >= 0; u--) {
        TEST_OK(zr_gpt_backward_unit(&s->m, u, s->p[u], s->p[0], s->g[u], s->g[0]));
    }
    return zr_gpt_loss(&s->m);
}

static void tokens(int *in, int *tg, int n)
{
    zr_test_rng r = {11};
    for (int i = 0; i < n; i++) {
        in[i] = (int)(zr_test_rng_next(&r) % (uint64_t)SMALL.vocab);
        tg[i] = (i * 7 + in[i]) % SMALL.vocab; /* learnable: a function of the input */
    }
}

static void test_model(void)
{
    enum { B = 4, T = 64 };
    int in[B * T], tg[B * T];
    tokens(in, tg, B * T);
    gpt_state f, h, off;
    state_init(&f, B, T, 0, NULL);
    state_init(&h, B, T, 1, NULL);
    setenv("ZR_CPU_BF16", "0", 1);
    state_init(&off, B, T, 1, "ZR_CPU_BF16=0");
    setenv("ZR_CPU_BF16", "force", 1);
    float lf = state_grads(&f, in, tg), lh = state_grads(&h, in, tg),
          lo = state_grads(&off, in, tg);
    TEST_CHECKF(fabsf(lh - lf) <= 1e-3f * lf && lh != lf, "loss bf16 %.8f vs fp32 %.8f", lh, lf);
    TEST_CHECKF(memcmp(&lo, &lf, 4) == 0, "ZR_CPU_BF16=0 loss %.8f vs fp32 %.8f", lo, lf);
    for (int u = 0; u < f.nu; u++) {
        size_t n = zr_gpt_unit_numel(&f.m, u);
        double d = 0, nf = 0;
        for (size_t i = 0; i < n; i++) {
            d += ((double)h.g[u][i] - f.g[u][i]) * ((double)h.g[u][i] - f.g[u][i]);
            nf += (double)f.g[u][i] * f.g[u][i];
        }
        TEST_CHECKF(sqrt(d) <= 0.03 * sqrt(nf), "unit %d: bf16 gradient %.2e off, norm %.2e", u,
                    sqrt(d), sqrt(nf));
        TEST_CHECKF(memcmp(off.g[u], f.g[u], n * 4) == 0, "unit %d: ZR_CPU_BF16=0 != fp32", u);
    }
    state_free(&f), state_free(&h), state_free(&off);
}

/*
 * A fresh batch per step whose targets are a function of the input half the
 * time and random otherwise: a model learns the rule, and the loss stays far
 * above 0 (about half of ln V), so 2% of it is a real bound.
 */
static void half_rule_batch(int *in, int *tg, int n, int step)
{
    zr_test_rng r = {(uint64_t)step * 7919u + 3u};
    for (int i = 0; i < n; i++) {
        in[i] = (int)(zr_test_rng_next(&r) % (uint64_t)SMALL.vocab);
        uint64_t x = zr_test_rng_next(&r);
        tg[i] = (x & 1) ? (in[i] * 7 + 1) % SMALL.vocab : (int)((x >> 8) % (uint64_t)SMALL.vocab);
    }
}

/* The largest |bf16 - fp32| / fp32 of the recorded losses. */
static double largest_gap(float loss[2][7])
{
    double g = 0;
    for (int i = 0; i < 7; i++) {
        double d = fabs((double)loss[1][i] - loss[0][i]) / loss[0][i];
        g = d > g ? d : g;
    }
    return g;
}

/* 300 AdamW steps: bf16's loss within 2% of fp32's at step 1 and every 50th. */
static void test_training(void)
{
    enum { B = 4, T = 32, STEPS = 300 };
    int in[B * T], tg[B * T];
    gpt_state s[2];
    float loss[2][STEPS / 50 + 1];
    zr_adamw hp = zr_adamw_default();
    for (int k = 0; k < 2; k++) {
        state_init(&s[k], B, T, k, NULL);
        for (int step = 1; step <= STEPS; step++) {
            half_rule_batch(in, tg, B * T, step);
            float l = state_grads(&s[k], in, tg);
            if (step == 1 || step % 50 == 0) {
                loss[k][step / 50] = l;
            }
            for (int u = 0; u < s[k].nu; u++) {
                zr_adamw_update(&hp, 1e-3f, step, 1.0f, 1, s[k].p[u], s[k].g[u], s[k].mo[u],
                                s[k].vo[u], zr_gpt_unit_numel(&s[k].m, u));
            }
        }
        state_free(&s[k]);
    }
    for (int i = 0; i <= STEPS / 50; i++) {
        TEST_CHECKF(fabsf(loss[1][i] - loss[0][i]) <= 0.02f * loss[0][i],
                    "step %d: bf16 loss %.5f, fp32 %.5f", i ? i * 50 : 1, loss[1][i], loss[0][i]);
    }
    TEST_CHECKF(loss[0][STEPS / 50] < 0.8f * loss[0][0], "fp32 did not learn: %.4f -> %.4f",
                loss[0][0], loss[0][STEPS / 50]);
    printf("  300 steps: fp32 %.4f -> %.4f, bf16 %.4f -> %.4f (largest gap %.3f%%)\n", loss[0][0],
           loss[0][STEPS / 50], loss[1][0], loss[1][STEPS / 50], 100.0 * largest_gap(loss));
}

int main(void)
{
    setenv("ZR_CPU_BF16", "force", 1); /* every CPU: oneDNN's own kernels where it has none */
    const char *kernel = NULL;
    if (zr_blas_bf16_load(&kernel) != ZR_OK) { /* make setup installs it: not on CI */
        return zr_test_skip("no bf16 products here: %s", zr_error_message());
    }
    printf("bf16 products: %s\n", kernel);
    TEST_RUN(test_choose);
    TEST_RUN(test_gemm);
    TEST_RUN(test_threads);
    TEST_RUN(test_model);
    TEST_RUN(test_training);
    return zr_test_finish();
}
