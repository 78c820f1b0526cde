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

#include "exp_rules.h" /* zr_exp_approx */

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

#endif /* ZR_MODEL_OPS_MATH_H */
