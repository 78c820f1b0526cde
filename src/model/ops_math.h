/*
 * ops_math.h - the scalar arithmetic that every CPU path of the model shares:
 * exp and the fixed-order sums. Internal to src/model (ops.c, attention.c).
 *
 * Why hand-written reductions and exp: zr builds without -ffast-math, so
 * compilers neither reorder float sums nor vectorize calls to expf. Sums
 * are therefore taken over ZR_LANES fixed partial accumulators (a layout a
 * compiler maps onto vector registers of any width, and whose order never
 * depends on threads or alignment), and exp is a polynomial in plain
 * arithmetic that vectorizes. Everything is always inlined, so a caller
 * compiled for AVX2 or AVX-512 (target attributes) vectorizes it at that
 * width: the operations, and so the bits, are the same at every width.
 */
#ifndef ZR_MODEL_OPS_MATH_H
#define ZR_MODEL_OPS_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define ZR_LANES       16
#define ZR_MATH_INLINE static inline __attribute__((always_inline))

ZR_MATH_INLINE float zr_lanes_total(const float *acc)
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

ZR_MATH_INLINE float zr_sum_f(const float *x, int n)
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
    return zr_lanes_total(acc);
}

/* The largest of x[0..n-1], NaNs skipped (-INFINITY when there are only NaNs). */
ZR_MATH_INLINE float zr_max_f(const float *x, int n)
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

/*
 * exp(x) to about 1 ulp on [-87, 88] (Cephes expf reduction and
 * polynomial); finite inputs outside are clamped, so the result is finite
 * and positive, and a NaN comes back as NaN (a diverged run must show up
 * in the loss, not be hidden as a small probability). Branch-free (selects
 * only) so that loops calling it vectorize (gcc needs -fno-trapping-math,
 * which the Makefile sets, to turn the selects into vector blends).
 * The clamp is written so that NaN fails both comparisons and takes the
 * bound: the exponent k is then always in [-126, 127], k + 127 is positive,
 * and the shift into the exponent field is done on an unsigned value, so no
 * input can shift a negative number or convert an out-of-range float to int.
 * attention_x86.c repeats these operations with intrinsics, one for one.
 */
ZR_MATH_INLINE float zr_exp_approx(float x)
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

#endif /* ZR_MODEL_OPS_MATH_H */
