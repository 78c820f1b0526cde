/*
 * ops.c - the GPT-2 operators on the CPU other than attention (see ops.h
 * for conventions; attention.c has attention).
 *
 * Every operator is a body over a range of rows or of column blocks, run on
 * the process's pool (zr/pool.h). Per-row work is split by rows; sums over
 * rows (bias and LayerNorm weight gradients, the embedding's) are split by
 * blocks of ZR_COLS columns, each column summed over all rows in row order
 * by the thread that owns it. Either way every output element is computed
 * by the same operations in the same order whatever the thread count, and
 * the order is the one the single-threaded code has always used.
 *
 * Each body is always inlined into three functions: one compiled for the
 * build's target (SSE2 on the portable build), one with target("avx2") and
 * one with target("avx512f"), and the widest the CPU supports is picked at
 * run time (like src/quant). They hold the same IEEE operations (no -ffast-
 * math, -ffp-contract=off, fixed-lane sums from ops_math.h), so every width
 * gives the same bits; only the speed differs.
 */
#include "ops.h"

#include "ops_math.h"
#include "ops_task.h"
#include "zr/base.h"
#include "zr/pool.h"

#include "../base/blas.h"

/* ---- kernel selection ------------------------------------------------------- */

static int forced_scalar;

int zr_ops_isa(void)
{
    if (forced_scalar) {
        return ISA_SCALAR;
    }
#if ZR_OPS_X86
    __builtin_cpu_init();
    if (zr_cpu_cap() >= ZR_CPU_AVX512 && __builtin_cpu_supports("avx512f")) {
        return ISA_AVX512;
    }
    if (zr_cpu_cap() >= ZR_CPU_AVX2 && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma")) {
        return ISA_AVX2;
    }
#endif
    return ISA_SCALAR;
}

void zr_ops_set_impl(zr_ops_impl impl)
{
    forced_scalar = impl == ZR_OPS_IMPL_SCALAR;
}

const char *zr_ops_impl_name(void)
{
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    return names[zr_ops_isa()];
}

/* ---- elementwise ------------------------------------------------------------ */

typedef struct ew_args {
    int isa;
    float *out;
    const float *a, *b;
} ew_args;

static inline __attribute__((always_inline)) void exp_body(const ew_args *x, size_t b, size_t e)
{
    float *out = x->out;
    const float *in = x->a;
    for (size_t i = b; i < e; i++) {
        out[i] = zr_exp_approx(in[i]);
    }
}
MULTIVERSION(exp, ew_args)

void zr_op_exp(float *out, const float *inp, size_t n)
{
    ew_args x = {zr_ops_isa(), out, inp, NULL};
    zr_parallel_for(n, ZR_GRAIN, exp_task, &x);
}

/* ---- encoder ---------------------------------------------------------------- */

typedef struct enc_args {
    int isa, N, T, C;
    float *out, *dwte, *dwpe;
    const float *wte, *wpe, *dout;
    const int *inp;
} enc_args;

/* rows i = b * T + t */
static inline __attribute__((always_inline)) void enc_fwd_body(const enc_args *a, size_t r0,
                                                               size_t r1)
{
    const size_t C = (size_t)a->C;
    for (size_t i = r0; i < r1; i++) {
        float *o = a->out + i * C;
        const float *e = a->wte + (size_t)a->inp[i] * C;
        const float *p = a->wpe + (i % (size_t)a->T) * C;
        for (size_t c = 0; c < C; c++) {
            o[c] = e[c] + p[c];
        }
    }
}
MULTIVERSION(enc_fwd, enc_args)

void zr_op_encoder_fwd(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                       int C)
{
    enc_args a = {.isa = zr_ops_isa(),
                  .N = B * T,
                  .T = T,
                  .C = C,
                  .out = out,
                  .wte = wte,
                  .wpe = wpe,
                  .inp = inp};
    zr_parallel_for((size_t)B * T, zr_ops_row_grain((size_t)C), enc_fwd_task, &a);
}

/* column blocks, rows in order: a token seen twice adds in position order */
static inline __attribute__((always_inline)) void enc_bwd_body(const enc_args *a, size_t k0,
                                                               size_t k1)
{
    const size_t C = (size_t)a->C;
    const size_t c0 = k0 * ZR_COLS, c1 = k1 * ZR_COLS < C ? k1 * ZR_COLS : C;
    for (size_t i = 0; i < (size_t)a->N; i++) {
        const float *d = a->dout + i * C;
        float *de = a->dwte + (size_t)a->inp[i] * C;
        float *dp = a->dwpe + (i % (size_t)a->T) * C;
        for (size_t c = c0; c < c1; c++) {
            de[c] += d[c];
        }
        for (size_t c = c0; c < c1; c++) {
            dp[c] += d[c];
        }
    }
}
MULTIVERSION(enc_bwd, enc_args)

void zr_op_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                       int C)
{
    enc_args a = {.isa = zr_ops_isa(),
                  .N = B * T,
                  .T = T,
                  .C = C,
                  .dwte = dwte,
                  .dwpe = dwpe,
                  .dout = dout,
                  .inp = inp};
    zr_parallel_for(zr_ops_col_blocks(C), zr_ops_col_grain(B * T), enc_bwd_task, &a);
}

/* ---- layernorm -------------------------------------------------------------- */

typedef struct ln_args {
    int isa, N, C;
    float *out, *mean, *rstd, *res, *dinp, *dw, *db;
    const float *inp, *w, *b, *a, *t, *tbias, *dout;
} ln_args;

ZR_MATH_INLINE float sumsq_centered(const float *x, float mean, int n)
{
    float acc[ZR_LANES] = {0};
    int i = 0;
    for (; i + ZR_LANES <= n; i += ZR_LANES) {
        for (int k = 0; k < ZR_LANES; k++) {
            float d = x[i + k] - mean;
            acc[k] += d * d;
        }
    }
    for (int k = 0; i < n; i++, k++) {
        float d = x[i] - mean;
        acc[k] += d * d;
    }
    return zr_lanes_total(acc);
}

/* One row: out = (x - mean) * rstd * w + b. */
ZR_MATH_INLINE void ln_row(float *o, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int C)
{
    const float eps = 1e-5f;
    float mu = zr_sum_f(x, C) / (float)C;
    float var = sumsq_centered(x, mu, C) / (float)C;
    float rs = 1.0f / sqrtf(var + eps);
    for (int c = 0; c < C; c++) {
        o[c] = (x[c] - mu) * rs * w[c] + b[c];
    }
    *mean = mu;
    *rstd = rs;
}

/* rows; with a != NULL the row is first res = a + (t + tbias) */
static inline __attribute__((always_inline)) void ln_fwd_body(const ln_args *p, size_t r0,
                                                              size_t r1)
{
    const size_t C = (size_t)p->C;
    for (size_t i = r0; i < r1; i++) {
        const float *x = p->inp + i * C;
        if (p->a != NULL) {
            float *r = p->res + i * C;
            const float *a = p->a + i * C, *t = p->t + i * C, *tb = p->tbias;
            for (size_t c = 0; c < C; c++) {
                r[c] = a[c] + (t[c] + tb[c]);
            }
            x = r;
        }
        if (p->out != NULL) {
            ln_row(p->out + i * C, p->mean + i, p->rstd + i, x, p->w, p->b, p->C);
        }
    }
}
MULTIVERSION(ln_fwd, ln_args)

void zr_op_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N, int C)
{
    ln_args p = {.isa = zr_ops_isa(),
                 .N = N,
                 .C = C,
                 .out = out,
                 .mean = mean,
                 .rstd = rstd,
                 .inp = inp,
                 .w = w,
                 .b = b};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)C), ln_fwd_task, &p);
}

void zr_op_residual_layernorm_fwd(float *res, float *out, float *mean, float *rstd, const float *a,
                                  const float *t, const float *tbias, const float *w,
                                  const float *b, int N, int C)
{
    ln_args p = {.isa = zr_ops_isa(),
                 .N = N,
                 .C = C,
                 .out = out,
                 .mean = mean,
                 .rstd = rstd,
                 .res = res,
                 .w = w,
                 .b = b,
                 .a = a,
                 .t = t,
                 .tbias = tbias};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)C), ln_fwd_task, &p);
}

void zr_op_residual_fwd(float *res, const float *a, const float *t, const float *tbias, int N,
                        int C)
{
    ln_args p = {.isa = zr_ops_isa(), .N = N, .C = C, .res = res, .a = a, .t = t, .tbias = tbias};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)C), ln_fwd_task, &p);
}

/* rows: the input gradient, from the two row means it needs (fixed lane order) */
static inline __attribute__((always_inline)) void ln_bwd_rows_body(const ln_args *p, size_t r0,
                                                                   size_t r1)
{
    const int C = p->C;
    const float *w = p->w;
    for (size_t i = r0; i < r1; i++) {
        const float *x = p->inp + i * C;
        const float *d = p->dout + i * C;
        float *dx = p->dinp + i * C;
        float mu = p->mean[i], rs = p->rstd[i];
        float acc1[ZR_LANES] = {0}, acc2[ZR_LANES] = {0};
        int c = 0;
        for (; c + ZR_LANES <= C; c += ZR_LANES) {
            for (int k = 0; k < ZR_LANES; k++) {
                float dn = w[c + k] * d[c + k];
                float nrm = (x[c + k] - mu) * rs;
                acc1[k] += dn;
                acc2[k] += dn * nrm;
            }
        }
        for (int k = 0; c < C; c++, k++) {
            float dn = w[c] * d[c];
            float nrm = (x[c] - mu) * rs;
            acc1[k] += dn;
            acc2[k] += dn * nrm;
        }
        float dn_mean = zr_lanes_total(acc1) / (float)C;
        float dnn_mean = zr_lanes_total(acc2) / (float)C;
        for (c = 0; c < C; c++) {
            float nrm = (x[c] - mu) * rs;
            float dn = w[c] * d[c];
            dx[c] += (dn - dn_mean - nrm * dnn_mean) * rs;
        }
    }
}
MULTIVERSION(ln_bwd_rows, ln_args)

/* column blocks: the weight and bias gradients, every row in order */
static inline __attribute__((always_inline)) void ln_bwd_cols_body(const ln_args *p, size_t k0,
                                                                   size_t k1)
{
    const size_t C = (size_t)p->C;
    const size_t c0 = k0 * ZR_COLS, c1 = k1 * ZR_COLS < C ? k1 * ZR_COLS : C;
    float *dw = p->dw, *db = p->db;
    for (size_t i = 0; i < (size_t)p->N; i++) {
        const float *x = p->inp + i * C;
        const float *d = p->dout + i * C;
        float mu = p->mean[i], rs = p->rstd[i];
        for (size_t c = c0; c < c1; c++) {
            float nrm = (x[c] - mu) * rs;
            db[c] += d[c];
            dw[c] += nrm * d[c];
        }
    }
}
MULTIVERSION(ln_bwd_cols, ln_args)

void zr_op_layernorm_bwd_acc(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C)
{
    ln_args p = {.isa = zr_ops_isa(),
                 .N = N,
                 .C = C,
                 .mean = (float *)mean,
                 .rstd = (float *)rstd,
                 .dinp = dinp,
                 .dw = dw,
                 .db = db,
                 .inp = inp,
                 .w = w,
                 .dout = dout};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)C), ln_bwd_rows_task, &p);
    zr_parallel_for(zr_ops_col_blocks(C), zr_ops_col_grain(N), ln_bwd_cols_task, &p);
}

/* ---- bias, matmul ------------------------------------------------------------ */

typedef struct bias_args {
    int isa, N, OC;
    float *out, *db, *pre;
    const float *bias, *d, *inp;
} bias_args;

static inline __attribute__((always_inline)) void bias_add_body(const bias_args *a, size_t r0,
                                                                size_t r1)
{
    const size_t OC = (size_t)a->OC;
    for (size_t i = r0; i < r1; i++) {
        float *o = a->out + i * OC;
        for (size_t j = 0; j < OC; j++) {
            o[j] += a->bias[j];
        }
    }
}
MULTIVERSION(bias_add, bias_args)

static inline __attribute__((always_inline)) void colsum_body(const bias_args *a, size_t k0,
                                                              size_t k1)
{
    const size_t OC = (size_t)a->OC;
    const size_t c0 = k0 * ZR_COLS, c1 = k1 * ZR_COLS < OC ? k1 * ZR_COLS : OC;
    float *db = a->db;
    for (size_t i = 0; i < (size_t)a->N; i++) {
        const float *d = a->d + i * OC;
        for (size_t c = c0; c < c1; c++) {
            db[c] += d[c];
        }
    }
}
MULTIVERSION(colsum, bias_args)

void zr_op_colsum_acc(float *db, const float *d, int N, int OC)
{
    bias_args a = {.isa = zr_ops_isa(), .N = N, .OC = OC, .db = db, .d = d};
    zr_parallel_for(zr_ops_col_blocks(OC), zr_ops_col_grain(N), colsum_task, &a);
}

void zr_op_matmul_fwd(zr_op_products *p, float *out, const float *inp, const float *w,
                      const float *bias, int N, int C, int OC)
{
    zr_op_gemm(p, 0, 1, N, OC, C, inp, C, w, C, 0.0f, out, OC);
    if (bias != NULL) {
        bias_args a = {.isa = zr_ops_isa(), .N = N, .OC = OC, .out = out, .bias = bias};
        zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)OC), bias_add_task, &a);
    }
}

void zr_op_matmul_bwd(zr_op_products *p, float *dinp, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, int N, int C, int OC)
{
    zr_op_gemm(p, 0, 0, N, C, OC, dout, OC, w, C, 0.0f, dinp, C);
    zr_op_gemm(p, 1, 0, OC, C, N, dout, OC, inp, C, 1.0f, dw, C);
    if (db != NULL) {
        zr_op_colsum_acc(db, dout, N, OC);
    }
}

/* ---- GELU (tanh approximation, as GPT-2) -------------------------------------- */

#define ZR_GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

/* tanh(u) = 1 - 2 / (exp(2u) + 1); exp clamps, so +-1 at the ends. */
ZR_MATH_INLINE float tanh_approx(float u)
{
    return 1.0f - 2.0f / (zr_exp_approx(2.0f * u) + 1.0f);
}

ZR_MATH_INLINE float gelu(float x)
{
    float u = ZR_GELU_S * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanh_approx(u));
}

ZR_MATH_INLINE float gelu_grad(float x)
{
    float u = ZR_GELU_S * (x + 0.044715f * x * x * x);
    float t = tanh_approx(u);
    float sech2 = 1.0f - t * t;
    return 0.5f * (1.0f + t) + x * 0.5f * sech2 * ZR_GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
}

/* rows: pre += bias (when given), out = gelu(pre) */
static inline __attribute__((always_inline)) void gelu_fwd_body(const bias_args *a, size_t r0,
                                                                size_t r1)
{
    const size_t OC = (size_t)a->OC;
    for (size_t i = r0; i < r1; i++) {
        float *o = a->out + i * OC;
        float *pre = a->pre + i * OC;
        if (a->bias != NULL) {
            for (size_t j = 0; j < OC; j++) {
                float x = pre[j] + a->bias[j];
                pre[j] = x;
                o[j] = gelu(x);
            }
        } else {
            for (size_t j = 0; j < OC; j++) {
                o[j] = gelu(pre[j]);
            }
        }
    }
}
MULTIVERSION(gelu_fwd, bias_args)

void zr_op_bias_gelu_fwd(float *out, float *pre, const float *bias, int N, int OC)
{
    bias_args a = {.isa = zr_ops_isa(), .N = N, .OC = OC, .out = out, .pre = pre, .bias = bias};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)OC), gelu_fwd_task, &a);
}

/* column blocks: dinp = gelu'(inp) * dout, and db += dinp row by row */
static inline __attribute__((always_inline)) void gelu_bwd_body(const bias_args *a, size_t k0,
                                                                size_t k1)
{
    const size_t OC = (size_t)a->OC;
    const size_t c0 = k0 * ZR_COLS, c1 = k1 * ZR_COLS < OC ? k1 * ZR_COLS : OC;
    for (size_t i = 0; i < (size_t)a->N; i++) {
        const float *x = a->inp + i * OC, *d = a->d + i * OC;
        float *dx = a->out + i * OC;
        for (size_t c = c0; c < c1; c++) {
            dx[c] = gelu_grad(x[c]) * d[c];
        }
        if (a->db != NULL) {
            for (size_t c = c0; c < c1; c++) {
                a->db[c] += dx[c];
            }
        }
    }
}
MULTIVERSION(gelu_bwd, bias_args)

void zr_op_gelu_bwd(float *dinp, float *db, const float *inp, const float *dout, int N, int OC)
{
    bias_args a = {
        .isa = zr_ops_isa(), .N = N, .OC = OC, .out = dinp, .db = db, .d = dout, .inp = inp};
    zr_parallel_for(zr_ops_col_blocks(OC), zr_ops_col_grain(N), gelu_bwd_task, &a);
}

/* ---- fused softmax + cross-entropy ---------------------------------------------- */

typedef struct xent_args {
    int isa, V, Vp;
    float *probs, *losses, dloss;
    const int *targets;
} xent_args;

static inline __attribute__((always_inline)) void xent_fwd_body(const xent_args *a, size_t r0,
                                                                size_t r1)
{
    const int V = a->V, Vp = a->Vp;
    for (size_t i = r0; i < r1; i++) {
        float *p = a->probs + i * (size_t)Vp;
        float mx = zr_max_f(p, V);
        float xt = a->targets != NULL ? p[a->targets[i]] : 0.0f;
        for (int j = 0; j < V; j++) {
            p[j] = zr_exp_approx(p[j] - mx);
        }
        float sum = zr_sum_f(p, V);
        float inv = 1.0f / sum;
        for (int j = 0; j < V; j++) {
            p[j] *= inv;
        }
        for (int j = V; j < Vp; j++) {
            p[j] = 0.0f;
        }
        if (a->targets != NULL) {
            /* log-sum-exp form: finite even when p(target) underflows */
            a->losses[i] = logf(sum) - (xt - mx);
        }
    }
}
MULTIVERSION(xent_fwd, xent_args)

void zr_op_softmax_xent_fwd(float *probs, float *losses, const int *targets, int N, int V, int Vp)
{
    xent_args a = {.isa = zr_ops_isa(),
                   .V = V,
                   .Vp = Vp,
                   .probs = probs,
                   .losses = losses,
                   .targets = targets};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)Vp), xent_fwd_task, &a);
}

static inline __attribute__((always_inline)) void xent_bwd_body(const xent_args *a, size_t r0,
                                                                size_t r1)
{
    for (size_t i = r0; i < r1; i++) {
        float *p = a->probs + i * (size_t)a->Vp;
        p[a->targets[i]] -= 1.0f;
        for (int j = 0; j < a->V; j++) {
            p[j] *= a->dloss;
        }
    }
}
MULTIVERSION(xent_bwd, xent_args)

void zr_op_softmax_xent_bwd(float *probs, const int *targets, float dloss, int N, int V, int Vp)
{
    xent_args a = {
        .isa = zr_ops_isa(), .V = V, .Vp = Vp, .probs = probs, .dloss = dloss, .targets = targets};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)Vp), xent_bwd_task, &a);
}
