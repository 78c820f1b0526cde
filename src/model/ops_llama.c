/*
 * ops_llama.c - the Llama family's operators on the CPU (issue 43) other
 * than attention (attention.c, whose streamed attention takes grouped key
 * and value heads): RMSNorm, rotary position embeddings (with llama3's
 * scaling of the frequencies) and SwiGLU. Conventions are ops.h's.
 *
 * The arithmetic follows transformers' modeling_llama.py, operation for
 * operation where the order shows in the bits: RMSNorm is w * (x * rstd)
 * with rstd = 1 / sqrt(mean(x^2) + eps); the rotary frequencies are
 * computed in float as _compute_llama3_parameters computes them; SiLU is
 * x / (1 + exp(-x)) with ops_math.h's exp. Sums use the fixed lanes of
 * ops_math.h, so (as in ops.c) every vector width and thread count gives
 * the same bits: each body is compiled for the build's target, AVX2 and
 * AVX-512, and the widest the CPU has runs.
 */
#include "ops.h"

#include "ops_math.h"
#include "ops_task.h"
#include "zr/base.h"
#include "zr/pool.h"

#include <math.h>

/* ---- RMSNorm ------------------------------------------------------------------ */

typedef struct rms_args {
    int isa, N, C;
    float eps;
    float *out, *rstd, *dinp, *dw;
    const float *inp, *w, *dout;
} rms_args;

ZR_MATH_INLINE void rms_fwd_body(const rms_args *p, size_t r0, size_t r1)
{
    const int C = p->C;
    for (size_t i = r0; i < r1; i++) {
        const float *x = p->inp + i * C;
        float *y = p->out + i * C;
        float acc[ZR_LANES] = {0};
        int c = 0;
        for (; c + ZR_LANES <= C; c += ZR_LANES) {
            for (int k = 0; k < ZR_LANES; k++) {
                acc[k] += x[c + k] * x[c + k];
            }
        }
        for (int k = 0; c < C; c++, k++) {
            acc[k] += x[c] * x[c];
        }
        float rs = 1.0f / sqrtf(zr_lanes_total(acc) / (float)C + p->eps);
        for (c = 0; c < C; c++) {
            y[c] = p->w[c] * (x[c] * rs);
        }
        p->rstd[i] = rs;
    }
}
MULTIVERSION(rms_fwd, rms_args)

void zr_op_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, float eps, int N,
                       int C)
{
    rms_args p = {.isa = zr_ops_isa(),
                  .N = N,
                  .C = C,
                  .eps = eps,
                  .out = out,
                  .rstd = rstd,
                  .inp = inp,
                  .w = w};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)C), rms_fwd_task, &p);
}

/* rows: dx += (dn - xn * mean(dn * xn)) * rstd, dn = w * dout, xn = x * rstd */
ZR_MATH_INLINE void rms_bwd_rows_body(const rms_args *p, size_t r0, size_t r1)
{
    const int C = p->C;
    const float *w = p->w;
    for (size_t i = r0; i < r1; i++) {
        const float *x = p->inp + i * C, *d = p->dout + i * C;
        float *dx = p->dinp + i * C;
        const float rs = p->rstd[i];
        float acc[ZR_LANES] = {0};
        int c = 0;
        for (; c + ZR_LANES <= C; c += ZR_LANES) {
            for (int k = 0; k < ZR_LANES; k++) {
                acc[k] += (w[c + k] * d[c + k]) * (x[c + k] * rs);
            }
        }
        for (int k = 0; c < C; c++, k++) {
            acc[k] += (w[c] * d[c]) * (x[c] * rs);
        }
        float m = zr_lanes_total(acc) / (float)C;
        for (c = 0; c < C; c++) {
            dx[c] += (w[c] * d[c] - (x[c] * rs) * m) * rs;
        }
    }
}
MULTIVERSION(rms_bwd_rows, rms_args)

/* column blocks: dw[c] += dout[i, c] * x[i, c] * rstd[i], every row in order */
ZR_MATH_INLINE void rms_bwd_cols_body(const rms_args *p, size_t k0, size_t k1)
{
    const size_t C = (size_t)p->C;
    const size_t c0 = k0 * ZR_COLS, c1 = k1 * ZR_COLS < C ? k1 * ZR_COLS : C;
    for (size_t i = 0; i < (size_t)p->N; i++) {
        const float *x = p->inp + i * C, *d = p->dout + i * C;
        const float rs = p->rstd[i];
        for (size_t c = c0; c < c1; c++) {
            p->dw[c] += d[c] * (x[c] * rs);
        }
    }
}
MULTIVERSION(rms_bwd_cols, rms_args)

void zr_op_rmsnorm_bwd_acc(float *dinp, float *dw, const float *dout, const float *inp,
                           const float *w, const float *rstd, int N, int C)
{
    rms_args p = {.isa = zr_ops_isa(),
                  .N = N,
                  .C = C,
                  .rstd = (float *)rstd,
                  .dinp = dinp,
                  .dw = dw,
                  .inp = inp,
                  .w = w,
                  .dout = dout};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)C), rms_bwd_rows_task, &p);
    size_t blocks = zr_div_up((size_t)C, ZR_COLS);
    zr_parallel_for(blocks, zr_ops_row_grain((size_t)N * ZR_COLS), rms_bwd_cols_task, &p);
}

/* ---- rotary position embeddings ------------------------------------------------- */

/*
 * transformers' inverse frequencies, in float as torch computes them:
 * 1 / theta^(i / hd) for i = 0, 2, ..., then (llama3) by wavelength
 * 2 pi / f: unchanged below original / high_freq_factor, divided by factor
 * above original / low_freq_factor, and in between the blend
 * (1 - s) f / factor + s f, s = (original / wavelength - low) / (high - low).
 */
void zr_op_rope_inv_freq(float *inv_freq, int hd, double theta, const zr_op_rope_scaling *sc)
{
    for (int i = 0; i < hd / 2; i++) {
        float e = (float)(2 * i) / (float)hd;
        float f = 1.0f / (float)pow((double)(float)theta, (double)e);
        if (sc != NULL && sc->llama3) {
            const float factor = (float)sc->factor, lo = (float)sc->low_freq_factor;
            const float hi = (float)sc->high_freq_factor, old = (float)sc->original_max_pos;
            const float lo_wave = (float)(sc->original_max_pos / sc->low_freq_factor);
            const float hi_wave = (float)(sc->original_max_pos / sc->high_freq_factor);
            float wave = (float)6.283185307179586 / f; /* 2 * math.pi */
            float fl = wave > lo_wave ? f / factor : f;
            float s = (old / wave - lo) / (hi - lo);
            float smooth = (1.0f - s) * fl / factor + s * fl;
            f = !(wave < hi_wave) && !(wave > lo_wave) ? smooth : fl;
        }
        inv_freq[i] = f;
    }
}

void zr_op_rope_table(float *cosines, float *sines, const float *inv_freq, int T, int hd)
{
    const int h2 = hd / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < h2; i++) {
            float angle = (float)t * inv_freq[i];
            cosines[(size_t)t * h2 + i] = (float)cos((double)angle);
            sines[(size_t)t * h2 + i] = (float)sin((double)angle);
        }
    }
}

typedef struct rope_args {
    int isa, T, NH, hd;
    float sign; /* +1 forward, -1 backward (the inverse rotation) */
    float *out;
    const float *inp, *cosines, *sines;
} rope_args;

/*
 * rows i = b * T + t, each NH heads of hd: with c, s of position t and
 * frequency j < hd / 2, x1 = x[j], x2 = x[j + hd / 2]:
 * y[j] = x1 c - x2 s and y[j + hd / 2] = x2 c + x1 s (transformers'
 * q * cos + rotate_half(q) * sin); the backward rotates back (s -> -s).
 */
ZR_MATH_INLINE void rope_body(const rope_args *a, size_t r0, size_t r1)
{
    const int h2 = a->hd / 2;
    const size_t C = (size_t)a->NH * a->hd;
    for (size_t i = r0; i < r1; i++) {
        const float *c = a->cosines + (i % (size_t)a->T) * h2;
        const float *s = a->sines + (i % (size_t)a->T) * h2;
        for (int h = 0; h < a->NH; h++) {
            const float *x = a->inp + i * C + (size_t)h * a->hd;
            float *y = a->out + i * C + (size_t)h * a->hd;
            for (int j = 0; j < h2; j++) {
                float x1 = x[j], x2 = x[j + h2], sj = a->sign * s[j];
                y[j] = x1 * c[j] + (-x2) * sj;
                y[j + h2] = x2 * c[j] + x1 * sj;
            }
        }
    }
}
MULTIVERSION(rope, rope_args)

static void rope_run(float *out, const float *inp, const float *cosines, const float *sines, int B,
                     int T, int NH, int hd, float sign)
{
    ZR_ASSERT(hd % 2 == 0);
    rope_args a = {.isa = zr_ops_isa(),
                   .T = T,
                   .NH = NH,
                   .hd = hd,
                   .sign = sign,
                   .out = out,
                   .inp = inp,
                   .cosines = cosines,
                   .sines = sines};
    zr_parallel_for((size_t)B * T, zr_ops_row_grain((size_t)NH * hd), rope_task, &a);
}

void zr_op_rope_fwd(float *out, const float *inp, const float *cosines, const float *sines, int B,
                    int T, int NH, int hd)
{
    rope_run(out, inp, cosines, sines, B, T, NH, hd, 1.0f);
}

void zr_op_rope_bwd(float *dinp, const float *dout, const float *cosines, const float *sines, int B,
                    int T, int NH, int hd)
{
    rope_run(dinp, dout, cosines, sines, B, T, NH, hd, -1.0f);
}

/* ---- SwiGLU ----------------------------------------------------------------------- */

typedef struct glu_args {
    int isa, IC, ld;
    float *out, *dgate, *dup;
    const float *gate, *up, *dout;
} glu_args;

ZR_MATH_INLINE void glu_fwd_body(const glu_args *a, size_t r0, size_t r1)
{
    const size_t IC = (size_t)a->IC, ld = (size_t)a->ld;
    for (size_t i = r0; i < r1; i++) {
        const float *g = a->gate + i * ld, *u = a->up + i * ld;
        float *y = a->out + i * IC;
        for (size_t j = 0; j < IC; j++) {
            float silu = g[j] / (1.0f + zr_exp_approx(-g[j]));
            y[j] = silu * u[j];
        }
    }
}
MULTIVERSION(glu_fwd, glu_args)

/* sigma = 1 / (1 + exp(-g)): d silu / dg = sigma (1 + g (1 - sigma)) */
ZR_MATH_INLINE void glu_bwd_body(const glu_args *a, size_t r0, size_t r1)
{
    const size_t IC = (size_t)a->IC, ld = (size_t)a->ld;
    for (size_t i = r0; i < r1; i++) {
        const float *g = a->gate + i * ld, *u = a->up + i * ld, *d = a->dout + i * IC;
        float *dg = a->dgate + i * ld, *du = a->dup + i * ld;
        for (size_t j = 0; j < IC; j++) {
            float gj = g[j], uj = u[j], dj = d[j];
            float sig = 1.0f / (1.0f + zr_exp_approx(-gj));
            dg[j] = dj * uj * (sig * (1.0f + gj * (1.0f - sig)));
            du[j] = dj * (gj * sig);
        }
    }
}
MULTIVERSION(glu_bwd, glu_args)

void zr_op_swiglu_fwd(float *out, const float *gate, const float *up, int N, int IC, int ld)
{
    glu_args a = {.isa = zr_ops_isa(), .IC = IC, .ld = ld, .out = out, .gate = gate, .up = up};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)IC), glu_fwd_task, &a);
}

void zr_op_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                      const float *up, int N, int IC, int ld)
{
    glu_args a = {.isa = zr_ops_isa(),
                  .IC = IC,
                  .ld = ld,
                  .dgate = dgate,
                  .dup = dup,
                  .gate = gate,
                  .up = up,
                  .dout = dout};
    zr_parallel_for((size_t)N, zr_ops_row_grain((size_t)IC), glu_bwd_task, &a);
}
