/*
 * ops.c - the GPT-2 operators on the CPU (see ops.h for conventions).
 *
 * Why hand-written reductions and exp: zr builds without -ffast-math, so gcc
 * neither reorders float sums nor vectorizes calls to expf/tanhf. Sums are
 * therefore taken over ZR_LANES fixed partial accumulators (a layout gcc
 * maps onto vector registers, and whose order never depends on threads or
 * alignment), and exp is a polynomial in plain arithmetic that gcc
 * vectorizes. Attention runs on cblas_sgemm per (batch, head) in causal row
 * blocks, so the upper triangle costs at most one block of waste.
 */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define ZR_LANES 16

/* ---- fixed-order reductions --------------------------------------------- */

static float lanes_total(const float *acc)
{
    /* pairwise, in a fixed order */
    float s8[8];
    for (int k = 0; k < 8; k++) {
        s8[k] = acc[k] + acc[k + 8];
    }
    float s4[4];
    for (int k = 0; k < 4; k++) {
        s4[k] = s8[k] + s8[k + 4];
    }
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

static float sum_f(const float *x, int n)
{
    float acc[ZR_LANES] = {0};
    int i = 0;
    for (; i + ZR_LANES <= n; i += ZR_LANES) {
        for (int k = 0; k < ZR_LANES; k++) {
            acc[k] += x[i + k];
        }
    }
    for (int k = 0; i < n; i++, k++) {
        acc[k] += x[i];
    }
    return lanes_total(acc);
}

static float sumsq_centered(const float *x, float mean, int n)
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
    return lanes_total(acc);
}

static float dot_f(const float *a, const float *b, int n)
{
    float acc[ZR_LANES] = {0};
    int i = 0;
    for (; i + ZR_LANES <= n; i += ZR_LANES) {
        for (int k = 0; k < ZR_LANES; k++) {
            acc[k] += a[i + k] * b[i + k];
        }
    }
    for (int k = 0; i < n; i++, k++) {
        acc[k] += a[i] * b[i];
    }
    return lanes_total(acc);
}

static float max_f(const float *x, int n)
{
    float acc[ZR_LANES];
    for (int k = 0; k < ZR_LANES; k++) {
        acc[k] = -INFINITY;
    }
    int i = 0;
    for (; i + ZR_LANES <= n; i += ZR_LANES) {
        for (int k = 0; k < ZR_LANES; k++) {
            acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
        }
    }
    for (int k = 0; i < n; i++, k++) {
        acc[k] = x[i] > acc[k] ? x[i] : acc[k];
    }
    float m = acc[0];
    for (int k = 1; k < ZR_LANES; k++) {
        m = acc[k] > m ? acc[k] : m;
    }
    return m;
}

/* ---- vectorizable exp ----------------------------------------------------- */

/*
 * exp(x) to about 1 ulp on [-87, 88] (Cephes expf reduction and
 * polynomial); finite inputs outside are clamped, so the result is finite
 * and positive, and a NaN comes back as NaN (a diverged run must show up
 * in the loss, not be hidden as a small probability). Branch-free (selects
 * only) so that loops calling it vectorize.
 * The clamp is written so that NaN fails both comparisons and takes the
 * bound: the exponent k is then always in [-126, 127], k + 127 is positive,
 * and the shift into the exponent field is done on an unsigned value, so no
 * input can shift a negative number or convert an out-of-range float to int.
 */
static inline float exp_approx(float x)
{
    float xc = x > -87.0f ? x : -87.0f;
    xc = xc < 88.0f ? xc : 88.0f;
    /* round xc / ln2 to nearest with the 1.5 * 2^23 trick (no lrintf call) */
    float kf = xc * 1.44269504088896341f + 12582912.0f;
    kf -= 12582912.0f;
    float r = xc - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)kf + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x == x ? p * scale : x;
}

void zr_op_exp(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        out[i] = exp_approx(inp[i]);
    }
}

/* ---- encoder -------------------------------------------------------------- */

void zr_op_encoder_fwd(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                       int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)inp[b * T + t] * C;
            const float *p = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                o[c] = e[c] + p[c];
            }
        }
    }
}

void zr_op_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                       int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            float *de = dwte + (size_t)inp[b * T + t] * C;
            float *dp = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                de[c] += d[c];
            }
            for (int c = 0; c < C; c++) {
                dp[c] += d[c];
            }
        }
    }
}

/* ---- layernorm ------------------------------------------------------------ */

void zr_op_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N, int C)
{
    const float eps = 1e-5f;
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *o = out + (size_t)i * C;
        float mu = sum_f(x, C) / (float)C;
        float var = sumsq_centered(x, mu, C) / (float)C;
        float rs = 1.0f / sqrtf(var + eps);
        for (int c = 0; c < C; c++) {
            o[c] = (x[c] - mu) * rs * w[c] + b[c];
        }
        mean[i] = mu;
        rstd[i] = rs;
    }
}

void zr_op_layernorm_bwd_acc(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        const float *d = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        float mu = mean[i], rs = rstd[i];
        /* the two means the input gradient needs, in fixed lane order */
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
        float dn_mean = lanes_total(acc1) / (float)C;
        float dnn_mean = lanes_total(acc2) / (float)C;
        for (c = 0; c < C; c++) {
            float nrm = (x[c] - mu) * rs;
            float dn = w[c] * d[c];
            db[c] += d[c];
            dw[c] += nrm * d[c];
            dx[c] += (dn - dn_mean - nrm * dnn_mean) * rs;
        }
    }
}

/* ---- matmul ------------------------------------------------------------- */

void zr_op_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                      int OC)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, 0.0f, out,
                OC);
    if (bias != NULL) {
        for (int i = 0; i < N; i++) {
            float *o = out + (size_t)i * OC;
            for (int j = 0; j < OC; j++) {
                o[j] += bias[j];
            }
        }
    }
}

void zr_op_matmul_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, int N, int C, int OC)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 0.0f,
                dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw,
                C);
    if (db != NULL) {
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * OC;
            for (int j = 0; j < OC; j++) {
                db[j] += d[j];
            }
        }
    }
}

/* ---- attention ---------------------------------------------------------- */

void zr_op_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *A = att + ((size_t)b * NH + h) * T * T;
            float *y = out + (size_t)b * T * C + (size_t)h * hs;
            for (int r0 = 0; r0 < T; r0 += ZR_ATT_ROWS) {
                int r1 = r0 + ZR_ATT_ROWS < T ? r0 + ZR_ATT_ROWS : T;
                int rows = r1 - r0, n = r1; /* rows r0..r1-1 see keys 0..r1-1 at most */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, hs, scale,
                            q + (size_t)r0 * C3, C3, k, C3, 0.0f, A + (size_t)r0 * T, T);
                for (int i = r0; i < r1; i++) {
                    float *a = A + (size_t)i * T;
                    int len = i + 1;
                    float mx = max_f(a, len);
                    for (int j = 0; j < len; j++) {
                        a[j] = exp_approx(a[j] - mx);
                    }
                    float inv = 1.0f / sum_f(a, len);
                    for (int j = 0; j < len; j++) {
                        a[j] *= inv;
                    }
                    for (int j = len; j < n; j++) {
                        a[j] = 0.0f; /* masked: the y product below reads it */
                    }
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, n, 1.0f,
                            A + (size_t)r0 * T, T, v, C3, 0.0f, y + (size_t)r0 * C, C);
            }
        }
    }
}

void zr_op_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                         const float *att, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    memset(dqkv, 0, (size_t)B * T * C3 * sizeof *dqkv);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
            float *dk = dq + C;
            float *dv = dq + 2 * C;
            const float *A = att + ((size_t)b * NH + h) * T * T;
            const float *dy = dout + (size_t)b * T * C + (size_t)h * hs;
            for (int r0 = 0; r0 < T; r0 += ZR_ATT_ROWS) {
                int r1 = r0 + ZR_ATT_ROWS < T ? r0 + ZR_ATT_ROWS : T;
                int rows = r1 - r0, n = r1;
                const float *Ab = A + (size_t)r0 * T;
                float *D = scratch;
                /* datt = dy @ v^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, hs, 1.0f,
                            dy + (size_t)r0 * C, C, v, C3, 0.0f, D, T);
                /* dv += att^T @ dy */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, 1.0f, Ab, T,
                            dy + (size_t)r0 * C, C, 1.0f, dv, C3);
                /* softmax backward in place; masked entries have a = 0 and stay 0 */
                for (int i = r0; i < r1; i++) {
                    const float *a = A + (size_t)i * T;
                    float *d = D + (size_t)(i - r0) * T;
                    float s = dot_f(a, d, i + 1);
                    for (int j = 0; j < n; j++) {
                        d[j] = a[j] * (d[j] - s);
                    }
                }
                /* dq += scale * dpre @ k ; dk += scale * dpre^T @ q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, n, scale, D, T, k,
                            C3, 1.0f, dq + (size_t)r0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, scale, D, T,
                            q + (size_t)r0 * C3, C3, 1.0f, dk, C3);
            }
        }
    }
}

/* ---- GELU (tanh approximation, as GPT-2) -------------------------------- */

#define ZR_GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

/* tanh(u) = 1 - 2 / (exp(2u) + 1); exp_approx clamps, so +-1 at the ends. */
static inline float tanh_approx(float u)
{
    return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f);
}

void zr_op_gelu_fwd(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = ZR_GELU_S * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_approx(u));
    }
}

void zr_op_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = ZR_GELU_S * (x + 0.044715f * x * x * x);
        float t = tanh_approx(u);
        float sech2 = 1.0f - t * t;
        float g =
            0.5f * (1.0f + t) + x * 0.5f * sech2 * ZR_GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}

void zr_op_add(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}

/* ---- fused softmax + cross-entropy ---------------------------------------- */

void zr_op_softmax_xent_fwd(float *probs, float *losses, const int *targets, int N, int V, int Vp)
{
    for (int i = 0; i < N; i++) {
        float *p = probs + (size_t)i * Vp;
        float mx = max_f(p, V);
        float xt = targets != NULL ? p[targets[i]] : 0.0f;
        for (int j = 0; j < V; j++) {
            p[j] = exp_approx(p[j] - mx);
        }
        float sum = sum_f(p, V);
        float inv = 1.0f / sum;
        for (int j = 0; j < V; j++) {
            p[j] *= inv;
        }
        for (int j = V; j < Vp; j++) {
            p[j] = 0.0f;
        }
        if (targets != NULL) {
            /* log-sum-exp form: finite even when p(target) underflows */
            losses[i] = logf(sum) - (xt - mx);
        }
    }
}

void zr_op_softmax_xent_bwd(float *probs, const int *targets, float dloss, int N, int V, int Vp)
{
    for (int i = 0; i < N; i++) {
        float *p = probs + (size_t)i * Vp;
        p[targets[i]] -= 1.0f;
        for (int j = 0; j < V; j++) {
            p[j] *= dloss;
        }
    }
}
