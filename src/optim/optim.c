/*
 * optim.c - AdamW, clipping and norm helpers.
 *
 * The update runs in chunks: an auto-vectorized pass for the moments, a
 * square root through intrinsics (gcc will not vectorize sqrtf while errno
 * semantics are on, and zr does not build with -ffast-math; the vector
 * instruction is IEEE-exact, so the scalar fallback rounds identically),
 * then a vectorized pass for the parameter. Every element is independent,
 * so any sharding of a range gives bit-identical results.
 */
#include "zr/optim.h"

#include <math.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

#define ZR_ADAM_CHUNK 1024

zr_adamw zr_adamw_default(void)
{
    zr_adamw h = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    return h;
}

static void sqrt_inplace(float *x, size_t n)
{
    size_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(x + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
    }
#elif defined(__AVX__)
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
    }
#endif
    for (; i < n; i++) {
        x[i] = sqrtf(x[i]);
    }
}

void zr_adamw_update(const zr_adamw *h, float lr, int t, float grad_scale, int decay,
                     float *restrict param, const float *restrict grad, float *restrict m,
                     float *restrict v, size_t n)
{
    const float b1 = h->beta1, b2 = h->beta2, eps = h->eps;
    const float wd = decay ? h->weight_decay : 0.0f;
    const float c1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
    const float c2 = (float)(1.0 / (1.0 - pow((double)b2, (double)t)));
    float den[ZR_ADAM_CHUNK];
    for (size_t base = 0; base < n; base += ZR_ADAM_CHUNK) {
        size_t len = n - base < ZR_ADAM_CHUNK ? n - base : ZR_ADAM_CHUNK;
        float *p = param + base, *mm = m + base, *vv = v + base;
        const float *g = grad + base;
        for (size_t i = 0; i < len; i++) {
            float gi = g[i] * grad_scale;
            float mi = b1 * mm[i] + (1.0f - b1) * gi;
            float vi = b2 * vv[i] + (1.0f - b2) * (gi * gi);
            mm[i] = mi;
            vv[i] = vi;
            den[i] = vi * c2;
        }
        sqrt_inplace(den, len);
        for (size_t i = 0; i < len; i++) {
            float upd = (mm[i] * c1) / (den[i] + eps) + wd * p[i];
            p[i] -= lr * upd;
        }
    }
}

float zr_clip_scale(double grad_norm, float max_norm)
{
    if (max_norm <= 0.0f) {
        return 1.0f;
    }
    double s = (double)max_norm / (grad_norm + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}

double zr_sumsq(const float *x, size_t n)
{
    /* 8 double lanes: vectorizes, and the order depends only on n */
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; k++) {
            double d = x[i + k];
            acc[k] += d * d;
        }
    }
    for (int k = 0; i < n; i++, k++) {
        double d = x[i];
        acc[k] += d * d;
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

int zr_all_finite(const float *x, size_t n)
{
    /* x - x is 0 for finite x and NaN for Inf/NaN; one sum tells */
    float acc = 0.0f;
    for (size_t i = 0; i < n; i++) {
        acc += (x[i] - x[i]) != 0.0f ? 1.0f : 0.0f;
    }
    return acc == 0.0f;
}
