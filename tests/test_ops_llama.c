/*
 * test_ops_llama.c - the Llama family's operators on the CPU (issue 43):
 * RMSNorm, rotary embeddings (llama3 scaling), SwiGLU and attention with
 * grouped KV heads. Each forward against a double-precision reference
 * written here, each backward against central differences of that
 * reference, the attention at any group size against GPT-2's bit for bit
 * where they meet (KV heads = heads) and unchanged by the thread count and
 * the vector width; then every operator against what transformers computed
 * for layer 0 of the models scripts/hf_reference.py made (tests/data/hf).
 */
#define _DEFAULT_SOURCE /* M_PI, setenv */
#include "test.h"
#include "zr/pool.h"

#include "../src/model/ops.h" /* internal to src/model */

#include <cjson/cJSON.h>
#include <stdint.h>

/* ---- helpers ------------------------------------------------------------------ */

static float *randn(size_t n, float scale, uint64_t seed)
{
    zr_test_rng r = {seed};
    float *x = malloc(n * sizeof *x);
    TEST_CHECK(x != NULL);
    for (size_t i = 0; x != NULL && i < n; i++) {
        x[i] = scale * zr_test_rng_normal(&r);
    }
    return x;
}

static double *to64(const float *x, size_t n)
{
    double *y = malloc(n * sizeof *y);
    TEST_CHECK(y != NULL);
    for (size_t i = 0; y != NULL && i < n; i++) {
        y[i] = x[i];
    }
    return y;
}

/* max |a - b| / max(max |b|, floor) */
static double rel_diff(const float *a, const double *b, size_t n)
{
    double worst = 0, big = 1e-30;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        big = fmax(big, fabs(b[i]));
    }
    return worst / big;
}

static double rel_diff_f(const float *a, const float *b, size_t n)
{
    double worst = 0, big = 1e-30;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        big = fmax(big, fabs((double)b[i]));
    }
    return worst / big;
}

/*
 * A reference forward in double: out = f(in) for the inputs of one test.
 * fd_check compares the float backward's gradient g of L = sum(out * R)
 * with respect to input arrays[k] against central differences of L, at
 * `samples` spread indices: |g - fd| <= 1e-4 of the largest |g|.
 */
typedef struct fd_case {
    void (*fwd)(const struct fd_case *c, double *out);
    double *in[4]; /* the inputs in double, perturbed in place */
    size_t n_in[4], n_out;
    const double *R;
    const void *shape;
} fd_case;

static double fd_loss(const fd_case *c, double *out)
{
    c->fwd(c, out);
    double l = 0;
    for (size_t i = 0; i < c->n_out; i++) {
        l += out[i] * c->R[i];
    }
    return l;
}

static void fd_check(const char *what, const fd_case *c, int k, const float *g, int samples)
{
    double *out = malloc(c->n_out * sizeof *out), worst = 0, big = 1e-30;
    TEST_CHECK(out != NULL);
    for (size_t i = 0; i < c->n_in[k]; i++) {
        big = fmax(big, fabs((double)g[i]));
    }
    for (int s = 0; s < samples && out != NULL; s++) {
        size_t i = (size_t)s * 7919 % c->n_in[k];
        double x0 = c->in[k][i], h = 1e-4 * fmax(1.0, fabs(x0));
        c->in[k][i] = x0 + h;
        double lp = fd_loss(c, out);
        c->in[k][i] = x0 - h;
        double lm = fd_loss(c, out);
        c->in[k][i] = x0;
        worst = fmax(worst, fabs((lp - lm) / (2 * h) - g[i]));
    }
    printf("  %s: max |backward - central difference| / max |grad| = %.3g (bound 1e-4)\n", what,
           worst / big);
    TEST_CHECKF(worst <= 1e-4 * big, "%s: gradient differs by %.3g of its largest", what,
                worst / big);
    free(out);
}

/* ---- RMSNorm -------------------------------------------------------------------- */

typedef struct rms_shape {
    int N, C;
    double eps;
} rms_shape;

static void rms_ref(const fd_case *c, double *out)
{
    const rms_shape *s = c->shape;
    for (int i = 0; i < s->N; i++) {
        const double *x = c->in[0] + (size_t)i * s->C;
        double ss = 0;
        for (int j = 0; j < s->C; j++) {
            ss += x[j] * x[j];
        }
        double rs = 1.0 / sqrt(ss / s->C + s->eps);
        for (int j = 0; j < s->C; j++) {
            out[(size_t)i * s->C + j] = c->in[1][j] * x[j] * rs;
        }
    }
}

/* C not a multiple of the 16 lanes; rows of very different scales. */
static void test_rmsnorm(void)
{
    rms_shape s = {37, 100, 1e-5};
    const size_t n = (size_t)s.N * s.C;
    float *x = randn(n, 1.0f, 1), *w = randn((size_t)s.C, 0.3f, 2), *R = randn(n, 1.0f, 3);
    float *y = calloc(n, sizeof *y), *rstd = calloc((size_t)s.N, sizeof *rstd);
    float *dx = calloc(n, sizeof *dx), *dw = calloc((size_t)s.C, sizeof *dw);
    for (int i = 0; i < s.N; i++) {
        for (int j = 0; j < s.C; j++) {
            x[(size_t)i * s.C + j] *= (float)(i % 5 == 0 ? 1e-2 : 1.0 + i);
        }
    }
    for (int j = 0; j < s.C; j++) {
        w[j] += 1.0f;
    }
    fd_case c = {.fwd = rms_ref,
                 .in = {to64(x, n), to64(w, (size_t)s.C)},
                 .n_in = {n, (size_t)s.C},
                 .n_out = n,
                 .R = to64(R, n),
                 .shape = &s};
    double *ref = malloc(n * sizeof *ref);
    rms_ref(&c, ref);
    zr_op_rmsnorm_fwd(y, rstd, x, w, (float)s.eps, s.N, s.C);
    double e = rel_diff(y, ref, n);
    printf("  rmsnorm: max |out - fp64| / max |out| = %.3g (bound 1e-6)\n", e);
    TEST_CHECKF(e <= 1e-6, "rmsnorm forward differs by %.3g", e);
    zr_op_rmsnorm_bwd_acc(dx, dw, R, x, w, rstd, s.N, s.C);
    fd_check("rmsnorm dx", &c, 0, dx, 200);
    fd_check("rmsnorm dw", &c, 1, dw, 100);
    /* _acc: a second backward adds the same again */
    float *dx2 = malloc(n * sizeof *dx2);
    memcpy(dx2, dx, n * sizeof *dx);
    zr_op_rmsnorm_bwd_acc(dx2, dw, R, x, w, rstd, s.N, s.C);
    int twice = 1;
    for (size_t i = 0; i < n; i++) {
        twice &= dx2[i] == dx[i] + dx[i];
    }
    TEST_CHECKF(twice, "rmsnorm_bwd_acc does not add to dinp");
    free(x), free(w), free(R), free(y), free(rstd), free(dx), free(dw), free(dx2), free(ref);
    free(c.in[0]), free(c.in[1]), free((void *)c.R);
}

/* ---- rotary embeddings ------------------------------------------------------------ */

typedef struct rope_shape {
    int B, T, NH, hd;
    const float *cosines, *sines;
} rope_shape;

/* the rotation in double, from the float tables the operator uses */
static void rope_ref(const fd_case *c, double *out)
{
    const rope_shape *s = c->shape;
    const int h2 = s->hd / 2;
    for (int r = 0; r < s->B * s->T; r++) {
        const float *cs = s->cosines + (size_t)(r % s->T) * h2,
                    *sn = s->sines + (size_t)(r % s->T) * h2;
        for (int h = 0; h < s->NH; h++) {
            const size_t o = ((size_t)r * s->NH + h) * s->hd;
            for (int j = 0; j < h2; j++) {
                double x1 = c->in[0][o + j], x2 = c->in[0][o + j + h2];
                out[o + j] = x1 * cs[j] - x2 * sn[j];
                out[o + j + h2] = x2 * cs[j] + x1 * sn[j];
            }
        }
    }
}

/* llama3's frequency bands in double, from transformers' formula */
static double llama3_ref(double f, const zr_op_rope_scaling *sc)
{
    double wave = 2 * M_PI / f, lo_wave = sc->original_max_pos / sc->low_freq_factor;
    double hi_wave = sc->original_max_pos / sc->high_freq_factor;
    if (wave < hi_wave) {
        return f;
    }
    if (wave > lo_wave) {
        return f / sc->factor;
    }
    double s = (sc->original_max_pos / wave - sc->low_freq_factor) /
               (sc->high_freq_factor - sc->low_freq_factor);
    return (1 - s) * f / sc->factor + s * f;
}

static void test_rope(void)
{
    /* head_dim 128, theta 500000, Llama 3.1's scaling: every band is used */
    const zr_op_rope_scaling sc = {1, 8.0, 1.0, 4.0, 8192.0};
    float inv[64], plain[64];
    zr_op_rope_inv_freq(inv, 128, 500000.0, &sc);
    zr_op_rope_inv_freq(plain, 128, 500000.0, NULL);
    double worst = 0;
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < 64; i++) {
        double f = 1.0 / pow(500000.0, 2.0 * i / 128), want = llama3_ref(f, &sc);
        worst = fmax(worst, fabs(inv[i] - want) / want);
        worst = fmax(worst, fabs(plain[i] - f) / f);
        bands[inv[i] == plain[i] ? 0 : fabs(inv[i] * 8 - plain[i]) <= 1e-6 * plain[i] ? 2 : 1]++;
    }
    printf("  rope inv_freq (llama3, hd 128): max relative error %.3g, bands %d/%d/%d\n", worst,
           bands[0], bands[1], bands[2]);
    TEST_CHECKF(worst <= 1e-6, "inverse frequencies differ by %.3g", worst);
    TEST_CHECK(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);

    rope_shape s = {2, 45, 3, 24, NULL, NULL};
    const size_t n = (size_t)s.B * s.T * s.NH * s.hd, nt = (size_t)s.T * s.hd / 2;
    float *cs = malloc(nt * sizeof *cs), *sn = malloc(nt * sizeof *sn), f12[12];
    zr_op_rope_inv_freq(f12, s.hd, 10000.0, NULL);
    zr_op_rope_table(cs, sn, f12, s.T, s.hd);
    s.cosines = cs;
    s.sines = sn;
    float *x = randn(n, 1.0f, 11), *R = randn(n, 1.0f, 12), *y = malloc(n * sizeof *y);
    fd_case c = {
        .fwd = rope_ref, .in = {to64(x, n)}, .n_in = {n}, .n_out = n, .R = to64(R, n), .shape = &s};
    double *ref = malloc(n * sizeof *ref);
    rope_ref(&c, ref);
    zr_op_rope_fwd(y, x, cs, sn, s.B, s.T, s.NH, s.hd);
    double e = rel_diff(y, ref, n);
    printf("  rope: max |out - fp64| / max |out| = %.3g (bound 1e-6)\n", e);
    TEST_CHECKF(e <= 1e-6, "rope forward differs by %.3g", e);
    zr_op_rope_bwd(y, R, cs, sn, s.B, s.T, s.NH, s.hd);
    fd_check("rope dx", &c, 0, y, 200);
    /* in place gives the same bits */
    float *z = malloc(n * sizeof *z), *w = malloc(n * sizeof *w);
    memcpy(z, x, n * sizeof *z);
    zr_op_rope_fwd(w, x, cs, sn, s.B, s.T, s.NH, s.hd);
    zr_op_rope_fwd(z, z, cs, sn, s.B, s.T, s.NH, s.hd);
    TEST_CHECK(memcmp(z, w, n * sizeof *z) == 0);
    free(cs), free(sn), free(x), free(R), free(y), free(ref), free(z), free(w);
    free(c.in[0]), free((void *)c.R);
}

/* ---- SwiGLU ------------------------------------------------------------------------ */

typedef struct glu_shape {
    int N, IC;
} glu_shape;

static void glu_ref(const fd_case *c, double *out)
{
    for (size_t i = 0; i < c->n_out; i++) {
        double g = c->in[0][i];
        out[i] = g / (1.0 + exp(-g)) * c->in[1][i];
    }
}

static void test_swiglu(void)
{
    glu_shape s = {29, 136};
    const size_t n = (size_t)s.N * s.IC;
    float *g = randn(n, 3.0f, 21), *u = randn(n, 1.0f, 22), *R = randn(n, 1.0f, 23);
    g[0] = -100.0f; /* exp clamps: silu must still be ~0, finite */
    g[1] = 100.0f;
    float *y = malloc(n * sizeof *y), *dg = malloc(n * sizeof *dg), *du = malloc(n * sizeof *du);
    fd_case c = {.fwd = glu_ref,
                 .in = {to64(g, n), to64(u, n)},
                 .n_in = {n, n},
                 .n_out = n,
                 .R = to64(R, n),
                 .shape = &s};
    double *ref = malloc(n * sizeof *ref);
    glu_ref(&c, ref);
    zr_op_swiglu_fwd(y, g, u, s.N, s.IC, s.IC);
    double e = rel_diff(y, ref, n);
    printf("  swiglu: max |out - fp64| / max |out| = %.3g (bound 1e-6)\n", e);
    TEST_CHECKF(e <= 1e-6, "swiglu forward differs by %.3g", e);
    zr_op_swiglu_bwd(dg, du, R, g, u, s.N, s.IC, s.IC);
    TEST_CHECK(isfinite(dg[0]) && isfinite(dg[1]));
    fd_check("swiglu dgate", &c, 0, dg, 300);
    fd_check("swiglu dup", &c, 1, du, 300);
    /* gate and up as the halves of one [N, 2 IC] product: the same bits */
    float *gu = malloc(2 * n * sizeof *gu), *dgu = malloc(2 * n * sizeof *dgu);
    float *y2 = malloc(n * sizeof *y2);
    for (int i = 0; i < s.N; i++) {
        memcpy(gu + (size_t)i * 2 * s.IC, g + (size_t)i * s.IC, (size_t)s.IC * sizeof *g);
        memcpy(gu + (size_t)i * 2 * s.IC + s.IC, u + (size_t)i * s.IC, (size_t)s.IC * sizeof *u);
    }
    zr_op_swiglu_fwd(y2, gu, gu + s.IC, s.N, s.IC, 2 * s.IC);
    zr_op_swiglu_bwd(dgu, dgu + s.IC, R, gu, gu + s.IC, s.N, s.IC, 2 * s.IC);
    int same = memcmp(y, y2, n * sizeof *y) == 0;
    for (int i = 0; i < s.N; i++) {
        same &= memcmp(dgu + (size_t)i * 2 * s.IC, dg + (size_t)i * s.IC, s.IC * sizeof *dg) == 0;
        same &= memcmp(dgu + (size_t)i * 2 * s.IC + s.IC, du + (size_t)i * s.IC,
                       s.IC * sizeof *du) == 0;
    }
    TEST_CHECKF(same, "swiglu on a fused [N, 2 IC] layout gives other bits");
    free(g), free(u), free(R), free(y), free(dg), free(du), free(ref), free(gu), free(dgu),
        free(y2);
    free(c.in[0]), free(c.in[1]), free((void *)c.R);
}

/* ---- attention with grouped KV heads ------------------------------------------------ */

typedef struct att_shape {
    int B, T, NH, NKV, hd;
} att_shape;

/* in[0..2] = q, k, v; out [B, T, NH hd], one (b, h, i) after another */
static void att_ref(const fd_case *c, double *out)
{
    const att_shape *s = c->shape;
    const size_t lq = (size_t)s->NH * s->hd, lk = (size_t)s->NKV * s->hd;
    const double scale = 1.0 / sqrt((double)s->hd);
    double *p = malloc((size_t)s->T * sizeof *p);
    for (int b = 0; b < s->B; b++) {
        for (int h = 0; h < s->NH; h++) {
            const int kh = h / (s->NH / s->NKV);
            for (int i = 0; i < s->T; i++) {
                const double *q = c->in[0] + ((size_t)b * s->T + i) * lq + (size_t)h * s->hd;
                double mx = -INFINITY, l = 0;
                for (int j = 0; j <= i; j++) {
                    const double *k = c->in[1] + ((size_t)b * s->T + j) * lk + (size_t)kh * s->hd;
                    double d = 0;
                    for (int e = 0; e < s->hd; e++) {
                        d += q[e] * k[e];
                    }
                    p[j] = d * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= i; j++) {
                    p[j] = exp(p[j] - mx);
                    l += p[j];
                }
                double *y = out + ((size_t)b * s->T + i) * lq + (size_t)h * s->hd;
                for (int e = 0; e < s->hd; e++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++) {
                        acc +=
                            p[j] * c->in[2][((size_t)b * s->T + j) * lk + (size_t)kh * s->hd + e];
                    }
                    y[e] = acc / l;
                }
            }
        }
    }
    free(p);
}

typedef struct att_bufs {
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *scratch;
    size_t nq, nkv;
} att_bufs;

static att_bufs att_alloc(const att_shape *s, float scale, uint64_t seed)
{
    att_bufs a;
    a.nq = (size_t)s->B * s->T * s->NH * s->hd;
    a.nkv = (size_t)s->B * s->T * s->NKV * s->hd;
    a.q = randn(a.nq, scale, seed);
    a.k = randn(a.nkv, scale, seed + 1);
    a.v = randn(a.nkv, 1.0f, seed + 2);
    a.dout = randn(a.nq, 1.0f, seed + 3);
    a.out = malloc(a.nq * sizeof *a.out);
    a.dq = malloc(a.nq * sizeof *a.dq);
    a.dk = malloc(a.nkv * sizeof *a.dk);
    a.dv = malloc(a.nkv * sizeof *a.dv);
    a.lse = malloc((size_t)s->B * s->NH * s->T * sizeof *a.lse);
    a.scratch = malloc((size_t)s->B * s->NH * s->T * sizeof *a.scratch);
    return a;
}

static void att_free(att_bufs *a)
{
    free(a->q), free(a->k), free(a->v), free(a->out), free(a->lse), free(a->dout);
    free(a->dq), free(a->dk), free(a->dv), free(a->scratch);
}

static void att_run(const att_shape *s, att_bufs *a)
{
    zr_op_attention_gqa_fwd(a->out, a->lse, a->q, a->k, a->v, s->B, s->T, s->NH, s->NKV, s->hd);
    zr_op_attention_gqa_bwd(a->dq, a->dk, a->dv, a->scratch, a->dout, a->q, a->k, a->v, a->out,
                            a->lse, s->B, s->T, s->NH, s->NKV, s->hd);
}

/* forward vs fp64 (bound relative to max |v|, as test_model's), backward vs differences */
static void att_case(const att_shape *s, int fd_samples)
{
    att_bufs a = att_alloc(s, 1.3f, 100 + (uint64_t)s->T * s->NKV + s->hd);
    att_run(s, &a);
    fd_case c = {.fwd = att_ref,
                 .in = {to64(a.q, a.nq), to64(a.k, a.nkv), to64(a.v, a.nkv)},
                 .n_in = {a.nq, a.nkv, a.nkv},
                 .n_out = a.nq,
                 .R = to64(a.dout, a.nq),
                 .shape = s};
    double *ref = malloc(a.nq * sizeof *ref), worst = 0, vmax = 0;
    att_ref(&c, ref);
    for (size_t i = 0; i < a.nq; i++) {
        worst = fmax(worst, fabs((double)a.out[i] - ref[i]));
    }
    for (size_t i = 0; i < a.nkv; i++) {
        vmax = fmax(vmax, fabs((double)a.v[i]));
    }
    printf("  attention B=%d T=%d NH=%d NKV=%d hd=%d: max |out - fp64| / max |v| = %.3g "
           "(bound 2e-6)\n",
           s->B, s->T, s->NH, s->NKV, s->hd, worst / vmax);
    TEST_CHECKF(worst <= 2e-6 * vmax, "attention differs from fp64 by %.3g of max |v|",
                worst / vmax);
    if (fd_samples > 0) {
        fd_check("attention dq", &c, 0, a.dq, fd_samples);
        fd_check("attention dk", &c, 1, a.dk, fd_samples);
        fd_check("attention dv", &c, 2, a.dv, fd_samples);
    }
    free(ref), free(c.in[0]), free(c.in[1]), free(c.in[2]), free((void *)c.R);
    att_free(&a);
}

/*
 * GQA 4:1 over several key blocks and a partial tile (with differences),
 * MQA at head_dim 256, MHA, and GQA 2:1 at a head_dim that is no multiple
 * of the lanes.
 */
static void test_attention_gqa(void)
{
    att_case(&(att_shape){1, 70, 4, 1, 8}, 60);
    att_case(&(att_shape){2, 150, 8, 2, 40}, 0);
    att_case(&(att_shape){1, 130, 2, 1, 256}, 0);
    att_case(&(att_shape){1, 90, 3, 3, 24}, 0);
    att_case(&(att_shape){2, 33, 4, 2, 12}, 40);
}

/* KV heads = heads on q, k, v cut from one qkv: GPT-2's attention, bit for bit */
static void test_attention_gpt2_bits(void)
{
    const int B = 2, T = 97, NH = 3, hd = 32, C = NH * hd;
    const size_t n = (size_t)B * T * C;
    float *qkv = randn(3 * n, 1.3f, 51), *dout = randn(n, 1.0f, 52);
    float *out = malloc(n * sizeof *out), *lse = malloc((size_t)B * NH * T * sizeof *lse);
    float *dqkv = malloc(3 * n * sizeof *dqkv), *scr = malloc((size_t)B * NH * T * sizeof *scr);
    zr_op_attention_fwd(out, lse, qkv, B, T, C, NH);
    zr_op_attention_bwd(dqkv, scr, dout, qkv, out, lse, B, T, C, NH);
    att_shape s = {B, T, NH, NH, hd};
    att_bufs a = att_alloc(&s, 1.0f, 1);
    for (size_t r = 0; r < (size_t)B * T; r++) {
        memcpy(a.q + r * C, qkv + r * 3 * C, (size_t)C * sizeof *qkv);
        memcpy(a.k + r * C, qkv + r * 3 * C + C, (size_t)C * sizeof *qkv);
        memcpy(a.v + r * C, qkv + r * 3 * C + 2 * C, (size_t)C * sizeof *qkv);
    }
    memcpy(a.dout, dout, n * sizeof *dout);
    att_run(&s, &a);
    int same = memcmp(a.out, out, n * sizeof *out) == 0;
    same &= memcmp(a.lse, lse, (size_t)B * NH * T * sizeof *lse) == 0;
    for (size_t r = 0; r < (size_t)B * T; r++) {
        same &= memcmp(a.dq + r * C, dqkv + r * 3 * C, (size_t)C * sizeof *dqkv) == 0;
        same &= memcmp(a.dk + r * C, dqkv + r * 3 * C + C, (size_t)C * sizeof *dqkv) == 0;
        same &= memcmp(a.dv + r * C, dqkv + r * 3 * C + 2 * C, (size_t)C * sizeof *dqkv) == 0;
    }
    TEST_CHECKF(same, "GQA attention with NKV = NH differs from GPT-2's");
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(scr);
    att_free(&a);
}

/* 1 and 3 threads, the reference kernels and the widest: the same bits */
static void test_attention_threads_and_kernels(void)
{
    att_shape s = {2, 140, 8, 2, 16};
    att_bufs ref = att_alloc(&s, 1.3f, 61);
    att_run(&s, &ref);
    const int threads[] = {3, 1, 2};
    for (int k = 0; k < 3; k++) {
        zr_ops_set_impl(k >= 1 ? ZR_OPS_IMPL_SCALAR : ZR_OPS_IMPL_AUTO);
        TEST_OK(zr_threads_set(threads[k]));
        att_bufs a = att_alloc(&s, 1.3f, 61);
        att_run(&s, &a);
        int same = memcmp(a.out, ref.out, a.nq * sizeof *a.out) == 0 &&
                   memcmp(a.dq, ref.dq, a.nq * sizeof *a.dq) == 0 &&
                   memcmp(a.dk, ref.dk, a.nkv * sizeof *a.dk) == 0 &&
                   memcmp(a.dv, ref.dv, a.nkv * sizeof *a.dv) == 0;
        TEST_CHECKF(same, "%d threads, %s kernels: other bits", threads[k], zr_ops_impl_name());
        att_free(&a);
    }
    zr_ops_set_impl(ZR_OPS_IMPL_AUTO);
    TEST_OK(zr_threads_set(1));
    att_free(&ref);
}

/* ---- against transformers (tests/data/hf, scripts/hf_reference.py) ------------------ */

/* A whole file in memory (NULL if it cannot be read; *len its size). */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n = -1;
    if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
        *len = (size_t)n;
    } else {
        free(buf);
        buf = NULL;
    }
    if (f != NULL) {
        fclose(f);
    }
    TEST_CHECKF(buf != NULL, "cannot read %s", path);
    return buf;
}

/* A safetensors file: u64 header length, the JSON header, then the bytes. */
typedef struct st_file {
    char *buf;
    size_t len, data0;
    cJSON *hdr;
} st_file;

static int st_open(st_file *f, const char *path)
{
    uint64_t hl = 0;
    f->hdr = NULL;
    f->buf = slurp(path, &f->len);
    if (f->buf == NULL || f->len < 8) {
        return 0;
    }
    for (int i = 7; i >= 0; i--) {
        hl = hl << 8 | (unsigned char)f->buf[i];
    }
    TEST_CHECK(hl <= f->len - 8);
    f->data0 = 8 + (size_t)hl;
    f->hdr = hl <= f->len - 8 ? cJSON_ParseWithLength(f->buf + 8, (size_t)hl) : NULL;
    return f->hdr != NULL;
}

/* A copy of tensor name (F32, numel elements), or NULL with a failure. */
static float *st_get(const st_file *f, const char *name, size_t numel)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->hdr, name);
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    size_t a = 0, b = 0;
    if (cJSON_GetArraySize(off) == 2) {
        a = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        b = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
    }
    int ok = cJSON_IsString(dt) && strcmp(dt->valuestring, "F32") == 0 && b - a == numel * 4 &&
             f->data0 + b <= f->len;
    TEST_CHECKF(ok, "tensor %s: missing, not F32 or not %zu elements", name, numel);
    float *x = ok ? malloc(numel * sizeof *x) : NULL;
    if (x != NULL) {
        memcpy(x, f->buf + f->data0 + a, numel * sizeof *x);
    }
    return x;
}

/* A model's shapes, from its config.json (both forms of the rope keys). */
typedef struct hf_shape {
    int B, T, C, NH, NKV, hd, IC, V, layers, tied, qkv_bias;
    double eps, theta;
    zr_op_rope_scaling sc;
} hf_shape;

static double jnum(const cJSON *o, const char *key, double dflt)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : dflt;
}

static int hf_shape_read(hf_shape *s, const char *dir)
{
    char path[512];
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt = slurp(path, &len);
    cJSON *cfg = txt != NULL ? cJSON_Parse(txt) : NULL;
    free(txt);
    if (cfg == NULL) {
        return 0;
    }
    s->C = (int)jnum(cfg, "hidden_size", 0);
    s->NH = (int)jnum(cfg, "num_attention_heads", 1);
    s->NKV = (int)jnum(cfg, "num_key_value_heads", s->NH);
    s->hd = (int)jnum(cfg, "head_dim", s->C / s->NH);
    s->IC = (int)jnum(cfg, "intermediate_size", 0);
    s->V = (int)jnum(cfg, "vocab_size", 0);
    s->layers = (int)jnum(cfg, "num_hidden_layers", 0);
    s->tied = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings"));
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    s->qkv_bias = cJSON_IsString(mt) && strcmp(mt->valuestring, "qwen2") == 0;
    s->eps = jnum(cfg, "rms_norm_eps", 1e-6);
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (!cJSON_IsObject(rp)) {
        rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    }
    s->theta = jnum(cJSON_IsObject(rp) ? rp : cfg, "rope_theta", jnum(cfg, "rope_theta", 1e4));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    s->sc = (zr_op_rope_scaling){cJSON_IsString(type) && strcmp(type->valuestring, "llama3") == 0,
                                 jnum(rp, "factor", 1), jnum(rp, "low_freq_factor", 1),
                                 jnum(rp, "high_freq_factor", 1),
                                 jnum(rp, "original_max_position_embeddings", 1)};
    cJSON_Delete(cfg);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    txt = slurp(path, &len);
    cJSON *ref = txt != NULL ? cJSON_Parse(txt) : NULL;
    free(txt);
    s->B = (int)jnum(ref, "B", 0);
    s->T = (int)jnum(ref, "T", 0);
    cJSON_Delete(ref);
    return s->B > 0 && s->T > 0 && s->C > 0 && s->IC > 0;
}

/* The worst relative difference seen against transformers, over every model. */
static double hf_worst;

static void hf_compare(const char *model, const char *what, const float *got, const float *want,
                       size_t n)
{
    double e = got != NULL && want != NULL ? rel_diff_f(got, want, n) : INFINITY;
    hf_worst = fmax(hf_worst, e);
    printf("  %s %-24s max |zr - transformers| / max |transformers| = %.3g\n", model, what, e);
    TEST_CHECKF(e <= 1e-5, "%s: %s differs from transformers by %.3g (bound 1e-5)", model, what, e);
}

/* Layer 0's tensors of one model, and zr's results from them. */
typedef struct hf_layer {
    hf_shape s;
    size_t N, nq, nkv, nc, ni;
    float *x, *ln1_w, *ln1, *h1, *ln2_w, *ln2, *cos, *sin, *q, *k, *v, *q_rot, *k_rot, *att;
    float *gate, *up, *act, *dact, *dgate, *dup, *datt, *dq, *dk, *dv, *dh1, *dh2, *dln2, *dln2_w;
} hf_layer;

static void hf_layer_load(hf_layer *L, const st_file *f)
{
    const hf_shape *s = &L->s;
    L->N = (size_t)s->B * s->T;
    L->nq = L->N * s->NH * s->hd;
    L->nkv = L->N * s->NKV * s->hd;
    L->nc = L->N * s->C;
    L->ni = L->N * s->IC;
    const size_t nt = (size_t)s->T * s->hd, C = (size_t)s->C;
    struct {
        float **dst;
        const char *name;
        size_t n;
    } want[] = {
        {&L->x, "l0.x", L->nc},          {&L->ln1_w, "l0.ln1_w", C}, {&L->ln1, "l0.ln1", L->nc},
        {&L->h1, "l0.h1", L->nc},        {&L->ln2_w, "l0.ln2_w", C}, {&L->ln2, "l0.ln2", L->nc},
        {&L->cos, "l0.cos", nt},         {&L->sin, "l0.sin", nt},    {&L->q, "l0.q", L->nq},
        {&L->k, "l0.k", L->nkv},         {&L->v, "l0.v", L->nkv},    {&L->q_rot, "l0.q_rot", L->nq},
        {&L->k_rot, "l0.k_rot", L->nkv}, {&L->att, "l0.att", L->nq}, {&L->gate, "l0.gate", L->ni},
        {&L->up, "l0.up", L->ni},        {&L->act, "l0.act", L->ni}, {&L->dact, "l0.dact", L->ni},
        {&L->dgate, "l0.dgate", L->ni},  {&L->dup, "l0.dup", L->ni}, {&L->datt, "l0.datt", L->nq},
        {&L->dq, "l0.dq", L->nq},        {&L->dk, "l0.dk", L->nkv},  {&L->dv, "l0.dv", L->nkv},
        {&L->dh1, "l0.dh1", L->nc},      {&L->dh2, "l0.dh2", L->nc}, {&L->dln2, "l0.dln2", L->nc},
        {&L->dln2_w, "l0.dln2_w", C}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].dst = st_get(f, want[i].name, want[i].n);
    }
}

static void hf_layer_free(hf_layer *L)
{
    float **all[] = {&L->x,    &L->ln1_w, &L->ln1, &L->h1,   &L->ln2_w, &L->ln2,   &L->cos,
                     &L->sin,  &L->q,     &L->k,   &L->v,    &L->q_rot, &L->k_rot, &L->att,
                     &L->gate, &L->up,    &L->act, &L->dact, &L->dgate, &L->dup,   &L->datt,
                     &L->dq,   &L->dk,    &L->dv,  &L->dh1,  &L->dh2,   &L->dln2,  &L->dln2_w};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        free(*all[i]);
    }
}

/* The forward operators, each from transformers' own inputs. */
static void hf_forward(const char *m, const hf_layer *L, float *cs, float *sn, float *lse)
{
    const hf_shape *s = &L->s;
    const int N = (int)L->N, h2 = s->hd / 2;
    const size_t big =
        L->nq > L->ni ? (L->nq > L->nc ? L->nq : L->nc) : (L->ni > L->nc ? L->ni : L->nc);
    float *y = malloc(big * sizeof *y), *rs = malloc(L->N * sizeof *rs);
    float *full = malloc((size_t)s->T * s->hd * sizeof *full), inv[ZR_ATT_MAX_HS / 2];
    zr_op_rmsnorm_fwd(y, rs, L->x, L->ln1_w, (float)s->eps, N, s->C);
    hf_compare(m, "input_layernorm", y, L->ln1, L->nc);
    zr_op_rmsnorm_fwd(y, rs, L->h1, L->ln2_w, (float)s->eps, N, s->C);
    hf_compare(m, "post_attention_layernorm", y, L->ln2, L->nc);
    zr_op_rope_inv_freq(inv, s->hd, s->theta, &s->sc);
    zr_op_rope_table(cs, sn, inv, s->T, s->hd);
    for (int pass = 0; pass < 2; pass++) { /* transformers' tables are cat(half, half) */
        const float *half = pass ? sn : cs;
        for (int t = 0; t < s->T; t++) {
            for (int i = 0; i < s->hd; i++) {
                full[(size_t)t * s->hd + i] = half[(size_t)t * h2 + i % h2];
            }
        }
        hf_compare(m, pass ? "rotary sin" : "rotary cos", full, pass ? L->sin : L->cos,
                   (size_t)s->T * s->hd);
    }
    zr_op_rope_fwd(y, L->q, cs, sn, s->B, s->T, s->NH, s->hd);
    hf_compare(m, "q with rope", y, L->q_rot, L->nq);
    zr_op_rope_fwd(y, L->k, cs, sn, s->B, s->T, s->NKV, s->hd);
    hf_compare(m, "k with rope", y, L->k_rot, L->nkv);
    zr_op_attention_gqa_fwd(y, lse, L->q_rot, L->k_rot, L->v, s->B, s->T, s->NH, s->NKV, s->hd);
    hf_compare(m, "attention", y, L->att, L->nq);
    zr_op_swiglu_fwd(y, L->gate, L->up, N, s->IC, s->IC);
    hf_compare(m, "swiglu", y, L->act, L->ni);
    free(y), free(rs), free(full);
}

/* The backward operators, from transformers' output gradients and forward values. */
static void hf_backward(const char *m, const hf_layer *L, const float *cs, const float *sn)
{
    const hf_shape *s = &L->s;
    const int N = (int)L->N;
    const size_t big = L->nq > L->ni ? L->nq : L->ni;
    float *a = malloc(big * sizeof *a), *b = malloc(big * sizeof *b);
    float *c = malloc(L->nq * sizeof *c), *o = malloc(L->nq * sizeof *o);
    float *scr = malloc(L->N * s->NH * sizeof *scr), *l2 = malloc(L->nq * sizeof *l2);
    float *dx = malloc(L->nc * sizeof *dx), *dw = calloc((size_t)s->C, sizeof *dw);
    zr_op_swiglu_bwd(a, b, L->dact, L->gate, L->up, N, s->IC, s->IC);
    hf_compare(m, "swiglu dgate", a, L->dgate, L->ni);
    hf_compare(m, "swiglu dup", b, L->dup, L->ni);
    zr_op_attention_gqa_fwd(o, l2, L->q_rot, L->k_rot, L->v, s->B, s->T, s->NH, s->NKV, s->hd);
    zr_op_attention_gqa_bwd(a, b, c, scr, L->datt, L->q_rot, L->k_rot, L->v, o, l2, s->B, s->T,
                            s->NH, s->NKV, s->hd);
    zr_op_rope_bwd(a, a, cs, sn, s->B, s->T, s->NH, s->hd);
    zr_op_rope_bwd(b, b, cs, sn, s->B, s->T, s->NKV, s->hd);
    hf_compare(m, "dq (attention, rope)", a, L->dq, L->nq);
    hf_compare(m, "dk (attention, rope)", b, L->dk, L->nkv);
    hf_compare(m, "dv (attention)", c, L->dv, L->nkv);
    memcpy(dx, L->dh2, L->nc * sizeof *dx); /* the residual's share, then the norm's */
    float *rs = malloc(L->N * sizeof *rs), *y = malloc(L->nc * sizeof *y);
    zr_op_rmsnorm_fwd(y, rs, L->h1, L->ln2_w, (float)s->eps, N, s->C);
    zr_op_rmsnorm_bwd_acc(dx, dw, L->dln2, L->h1, L->ln2_w, rs, N, s->C);
    hf_compare(m, "rmsnorm dinp (+ residual)", dx, L->dh1, L->nc);
    hf_compare(m, "rmsnorm dweight", dw, L->dln2_w, (size_t)s->C);
    free(a), free(b), free(c), free(o), free(scr), free(l2), free(dx), free(dw), free(rs), free(y);
}

static void hf_model(const char *model)
{
    const char *root = getenv("ZR_HF_DATA") != NULL ? getenv("ZR_HF_DATA") : "tests/data/hf";
    char dir[400], path[512];
    snprintf(dir, sizeof dir, "%s/%s", root, model);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    hf_layer L = {0};
    st_file f = {0};
    if (!hf_shape_read(&L.s, dir) || !st_open(&f, path)) {
        TEST_CHECKF(0, "%s: cannot read its config.json, reference.json or tensors", dir);
    } else {
        hf_layer_load(&L, &f);
        const size_t nt = (size_t)L.s.T * L.s.hd / 2;
        float *cs = malloc(nt * sizeof *cs), *sn = malloc(nt * sizeof *sn);
        float *lse = malloc(L.N * L.s.NH * sizeof *lse);
        if (zr_test_failed_checks == 0) {
            hf_forward(model, &L, cs, sn, lse);
            hf_backward(model, &L, cs, sn);
        }
        free(cs), free(sn), free(lse);
    }
    hf_layer_free(&L);
    cJSON_Delete(f.hdr);
    free(f.buf);
}

static void test_vs_transformers(void)
{
    hf_worst = 0;
    hf_model("llama_gqa");
    hf_model("llama_mha_tied");
    printf("  worst over both models: %.3g (bound 1e-5)\n", hf_worst);
}

/* ---- a whole forward, composed from the operators, against transformers' logits ---- */

/* One tensor of model.safetensors by printf-style name (NULL and a failure if absent). */
static float *weight(const st_file *f, size_t n, const char *fmt, int layer)
{
    char name[160];
    snprintf(name, sizeof name, fmt, layer);
    return st_get(f, name, n);
}

static void add_to(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x[i] += y[i];
    }
}

/* x += attention block of layer l (pre-norm), scratch in w[0..5] */
static void fwd_attention(const hf_shape *s, const st_file *f, int l, float *x, float **w,
                          const float *cs, const float *sn)
{
    const int N = s->B * s->T, C = s->C, Q = s->NH * s->hd, K = s->NKV * s->hd;
    float *ln = weight(f, (size_t)C, "model.layers.%d.input_layernorm.weight", l);
    float *wq = weight(f, (size_t)Q * C, "model.layers.%d.self_attn.q_proj.weight", l);
    float *wk = weight(f, (size_t)K * C, "model.layers.%d.self_attn.k_proj.weight", l);
    float *wv = weight(f, (size_t)K * C, "model.layers.%d.self_attn.v_proj.weight", l);
    float *wo = weight(f, (size_t)C * Q, "model.layers.%d.self_attn.o_proj.weight", l);
    float *bq = NULL, *bk = NULL, *bv = NULL;
    if (s->qkv_bias) {
        bq = weight(f, (size_t)Q, "model.layers.%d.self_attn.q_proj.bias", l);
        bk = weight(f, (size_t)K, "model.layers.%d.self_attn.k_proj.bias", l);
        bv = weight(f, (size_t)K, "model.layers.%d.self_attn.v_proj.bias", l);
    }
    if (ln != NULL && wq != NULL && wk != NULL && wv != NULL && wo != NULL) {
        zr_op_rmsnorm_fwd(w[0], w[5], x, ln, (float)s->eps, N, C);
        zr_op_matmul_fwd(NULL, w[1], w[0], wq, bq, N, C, Q);
        zr_op_matmul_fwd(NULL, w[2], w[0], wk, bk, N, C, K);
        zr_op_matmul_fwd(NULL, w[3], w[0], wv, bv, N, C, K);
        zr_op_rope_fwd(w[1], w[1], cs, sn, s->B, s->T, s->NH, s->hd);
        zr_op_rope_fwd(w[2], w[2], cs, sn, s->B, s->T, s->NKV, s->hd);
        zr_op_attention_gqa_fwd(w[4], w[5], w[1], w[2], w[3], s->B, s->T, s->NH, s->NKV, s->hd);
        zr_op_matmul_fwd(NULL, w[0], w[4], wo, NULL, N, Q, C);
        add_to(x, w[0], (size_t)N * C);
    }
    free(ln), free(wq), free(wk), free(wv), free(wo), free(bq), free(bk), free(bv);
}

/* x += MLP block of layer l (pre-norm) */
static void fwd_mlp(const hf_shape *s, const st_file *f, int l, float *x, float **w)
{
    const int N = s->B * s->T, C = s->C, IC = s->IC;
    float *ln = weight(f, (size_t)C, "model.layers.%d.post_attention_layernorm.weight", l);
    float *wg = weight(f, (size_t)IC * C, "model.layers.%d.mlp.gate_proj.weight", l);
    float *wu = weight(f, (size_t)IC * C, "model.layers.%d.mlp.up_proj.weight", l);
    float *wd = weight(f, (size_t)C * IC, "model.layers.%d.mlp.down_proj.weight", l);
    if (ln != NULL && wg != NULL && wu != NULL && wd != NULL) {
        zr_op_rmsnorm_fwd(w[0], w[5], x, ln, (float)s->eps, N, C);
        zr_op_matmul_fwd(NULL, w[1], w[0], wg, NULL, N, C, IC);
        zr_op_matmul_fwd(NULL, w[2], w[0], wu, NULL, N, C, IC);
        zr_op_swiglu_fwd(w[3], w[1], w[2], N, IC, IC);
        zr_op_matmul_fwd(NULL, w[0], w[3], wd, NULL, N, IC, C);
        add_to(x, w[0], (size_t)N * C);
    }
    free(ln), free(wg), free(wu), free(wd);
}

/* The tokens of reference.json: in[B T] the first T of each row, tg the last T; the loss. */
static double ref_tokens(const char *dir, const hf_shape *s, int *in, int *tg)
{
    char path[512];
    size_t len;
    snprintf(path, sizeof path, "%s/reference.json", dir);
    char *txt = slurp(path, &len);
    cJSON *ref = txt != NULL ? cJSON_Parse(txt) : NULL;
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(ref, "tokens");
    int ok = cJSON_GetArraySize(rows) == s->B;
    for (int b = 0; ok && b < s->B; b++) {
        const cJSON *row = cJSON_GetArrayItem(rows, b);
        ok = cJSON_GetArraySize(row) == s->T + 1;
        for (int t = 0; ok && t < s->T; t++) {
            in[b * s->T + t] = cJSON_GetArrayItem(row, t)->valueint;
            tg[b * s->T + t] = cJSON_GetArrayItem(row, t + 1)->valueint;
        }
    }
    TEST_CHECKF(ok, "%s: tokens are not %d rows of %d", path, s->B, s->T + 1);
    double loss = jnum(ref, "loss", NAN);
    cJSON_Delete(ref);
    free(txt);
    return loss;
}

/* Embeddings, the layers, the final norm and the head: logits [N, V] (NULL on a failure). */
static float *model_logits(const hf_shape *s, const st_file *f, const int *in)
{
    const int N = s->B * s->T, C = s->C, V = s->V;
    const size_t big = (size_t)N * (s->NH * s->hd > s->IC ? s->NH * s->hd : s->IC) + C;
    float *x = malloc((size_t)N * C * sizeof *x), *w[6], inv[ZR_ATT_MAX_HS / 2];
    float *cs = malloc((size_t)s->T * s->hd / 2 * sizeof *cs);
    float *sn = malloc((size_t)s->T * s->hd / 2 * sizeof *sn);
    for (int i = 0; i < 6; i++) {
        w[i] = malloc(big * sizeof *w[i] + (size_t)N * s->NH * sizeof(float));
    }
    float *emb = weight(f, (size_t)V * C, "model.embed_tokens.weight", 0);
    float *head = s->tied ? emb : weight(f, (size_t)V * C, "lm_head.weight", 0);
    float *norm = weight(f, (size_t)C, "model.norm.weight", 0);
    float *logits = malloc((size_t)N * V * sizeof *logits);
    zr_op_rope_inv_freq(inv, s->hd, s->theta, &s->sc);
    zr_op_rope_table(cs, sn, inv, s->T, s->hd);
    for (int i = 0; emb != NULL && i < N; i++) {
        memcpy(x + (size_t)i * C, emb + (size_t)in[i] * C, (size_t)C * sizeof *x);
    }
    for (int l = 0; emb != NULL && l < s->layers && zr_test_failed_checks == 0; l++) {
        fwd_attention(s, f, l, x, w, cs, sn);
        fwd_mlp(s, f, l, x, w);
    }
    if (emb != NULL && head != NULL && norm != NULL && zr_test_failed_checks == 0) {
        zr_op_rmsnorm_fwd(w[0], w[5], x, norm, (float)s->eps, N, C);
        zr_op_matmul_fwd(NULL, logits, w[0], head, NULL, N, C, V);
    } else {
        free(logits);
        logits = NULL;
    }
    for (int i = 0; i < 6; i++) {
        free(w[i]);
    }
    if (head != emb) {
        free(head);
    }
    free(x), free(cs), free(sn), free(emb), free(norm);
    return logits;
}

static void hf_whole(const char *model)
{
    const char *root = getenv("ZR_HF_DATA") != NULL ? getenv("ZR_HF_DATA") : "tests/data/hf";
    char dir[400], path[512];
    snprintf(dir, sizeof dir, "%s/%s", root, model);
    hf_shape s = {0};
    st_file mf = {0}, rf = {0};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int ok = hf_shape_read(&s, dir) && st_open(&mf, path);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ok = ok && st_open(&rf, path);
    const size_t N = (size_t)s.B * s.T;
    int *in = malloc(N * sizeof *in), *tg = malloc(N * sizeof *tg);
    float *want = ok ? st_get(&rf, "logits", N * s.V) : NULL;
    double loss_ref = ok ? ref_tokens(dir, &s, in, tg) : NAN;
    float *got = ok && want != NULL ? model_logits(&s, &mf, in) : NULL;
    TEST_CHECKF(got != NULL, "%s: no logits", model);
    if (got != NULL) {
        hf_compare(model, "logits (whole forward)", got, want, N * s.V);
        float *losses = malloc(N * sizeof *losses);
        zr_op_softmax_xent_fwd(got, losses, tg, (int)N, s.V, s.V);
        double loss = 0;
        for (size_t i = 0; i < N; i++) {
            loss += losses[i];
        }
        loss /= (double)N;
        printf("  %s loss %.9g, transformers %.9g: relative %.3g (bound 1e-5)\n", model, loss,
               loss_ref, fabs(loss - loss_ref) / loss_ref);
        TEST_CHECKF(fabs(loss - loss_ref) <= 1e-5 * loss_ref, "%s: loss %.9g vs %.9g", model, loss,
                    loss_ref);
        free(losses);
    }
    free(in), free(tg), free(want), free(got);
    cJSON_Delete(mf.hdr), cJSON_Delete(rf.hdr);
    free(mf.buf), free(rf.buf);
}

/*
 * Every operator together: embeddings, 2 layers (GQA + llama3 rope; MHA,
 * head_dim given, tied; Qwen2's q/k/v biases), final norm, head, loss.
 */
static void test_forward_vs_transformers(void)
{
    hf_whole("llama_gqa");
    hf_whole("llama_mha_tied");
    hf_whole("qwen2");
}

/*
 * RMSNorm, rope and SwiGLU, forward and backward, at 1 and 3 threads with
 * the widest kernels and at 1 and 2 with the reference ones: the same bits
 * (N spans several row tasks, C and IC are no multiple of the lanes).
 */
typedef struct ew_out {
    float *y, *rstd, *dx, *dw, *r, *dr, *g, *dg, *du;
} ew_out;

static void ew_run(ew_out *o, const float *x, const float *w, const float *R, const float *cs,
                   const float *sn, int N, int C, int T)
{
    const size_t n = (size_t)N * C;
    o->y = malloc(n * sizeof *o->y);
    o->rstd = malloc((size_t)N * sizeof *o->rstd);
    o->dx = calloc(n, sizeof *o->dx);
    o->dw = calloc((size_t)C, sizeof *o->dw);
    o->r = malloc(n * sizeof *o->r);
    o->dr = malloc(n * sizeof *o->dr);
    o->g = malloc(n * sizeof *o->g);
    o->dg = malloc(n * sizeof *o->dg);
    o->du = malloc(n * sizeof *o->du);
    zr_op_rmsnorm_fwd(o->y, o->rstd, x, w, 1e-5f, N, C);
    zr_op_rmsnorm_bwd_acc(o->dx, o->dw, R, x, w, o->rstd, N, C);
    zr_op_rope_fwd(o->r, x, cs, sn, N / T, T, C / 40, 40);
    zr_op_rope_bwd(o->dr, R, cs, sn, N / T, T, C / 40, 40);
    zr_op_swiglu_fwd(o->g, x, R, N, C, C);
    zr_op_swiglu_bwd(o->dg, o->du, w, x, R, N, C, C);
}

static int ew_same(const ew_out *a, const ew_out *b, size_t n, size_t N, size_t C)
{
    return !memcmp(a->y, b->y, n * 4) && !memcmp(a->rstd, b->rstd, N * 4) &&
           !memcmp(a->dx, b->dx, n * 4) && !memcmp(a->dw, b->dw, C * 4) &&
           !memcmp(a->r, b->r, n * 4) && !memcmp(a->dr, b->dr, n * 4) &&
           !memcmp(a->g, b->g, n * 4) && !memcmp(a->dg, b->dg, n * 4) &&
           !memcmp(a->du, b->du, n * 4);
}

static void ew_free(ew_out *o)
{
    free(o->y), free(o->rstd), free(o->dx), free(o->dw), free(o->r), free(o->dr), free(o->g);
    free(o->dg), free(o->du);
}

static void test_threads_and_kernels_same_bits(void)
{
    const int T = 150, N = 2 * T, C = 360; /* rope: 9 heads of 40 */
    const size_t n = (size_t)N * C;
    float *x = randn(n, 2.0f, 71), *R = randn(n, 1.0f, 72), *w = randn(n, 1.0f, 73), f20[20];
    float *cs = malloc((size_t)T * 20 * sizeof *cs), *sn = malloc((size_t)T * 20 * sizeof *sn);
    zr_op_rope_inv_freq(f20, 40, 10000.0, &(zr_op_rope_scaling){1, 8.0, 1.0, 4.0, 64.0});
    zr_op_rope_table(cs, sn, f20, T, 40);
    ew_out ref;
    ew_run(&ref, x, w, R, cs, sn, N, C, T);
    const int threads[] = {3, 1, 2};
    for (int k = 0; k < 3; k++) {
        zr_ops_set_impl(k >= 1 ? ZR_OPS_IMPL_SCALAR : ZR_OPS_IMPL_AUTO);
        TEST_OK(zr_threads_set(threads[k]));
        ew_out o;
        ew_run(&o, x, w, R, cs, sn, N, C, T);
        TEST_CHECKF(ew_same(&o, &ref, n, (size_t)N, (size_t)C),
                    "%d threads, %s kernels: other bits", threads[k], zr_ops_impl_name());
        ew_free(&o);
    }
    zr_ops_set_impl(ZR_OPS_IMPL_AUTO);
    TEST_OK(zr_threads_set(1));
    printf("  rmsnorm, rope, swiglu: 1, 2, 3 threads and the reference kernels agree bit for bit "
           "(vector path %s)\n",
           zr_ops_impl_name());
    ew_free(&ref);
    free(x), free(R), free(w), free(cs), free(sn);
}

/*
 * --cpu NAME: the kernels capped at NAME (ZR_CPU), so that a wider CPU also
 * runs the AVX2 ones against the reference (as test_model --cpu).
 */
int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--cpu") == 0) {
        setenv("ZR_CPU", argv[2], 1);
        printf("  kernels capped at %s: %s\n", argv[2], zr_ops_impl_name());
    } else if (argc != 1) {
        fprintf(stderr, "usage: test_ops_llama [--cpu sse2|avx2|avx512]\n");
        return 2;
    }
    TEST_OK(zr_threads_set(1));
    TEST_RUN(test_rmsnorm);
    TEST_RUN(test_rope);
    TEST_RUN(test_swiglu);
    TEST_RUN(test_threads_and_kernels_same_bits);
    TEST_RUN(test_attention_gqa);
    TEST_RUN(test_attention_gpt2_bits);
    TEST_RUN(test_attention_threads_and_kernels);
    TEST_RUN(test_vs_transformers);
    TEST_RUN(test_forward_vs_transformers);
    return zr_test_finish();
}
