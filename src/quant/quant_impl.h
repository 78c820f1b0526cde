/*
 * quant_impl.h - the private seam between the block codec (quant.c) and its
 * kernels: the scalar oracle (quant.c) and the x86 vector paths (quant_x86.c).
 *
 * The codec does everything that is per group (header, scales, non-finite
 * handling, the choice of scale) once, in scalar C shared by every
 * implementation; kernels only run the per-element loops over one segment of
 * one group. The per-element rules are the static inline helpers below, and
 * vector kernels hand their tails (n % 16 elements) to the scalar kernel, so
 * the only thing a vector path can get wrong is its main loop, which the
 * tests compare bit for bit against the oracle.
 *
 * Not installed; nothing outside src/quant includes it.
 */
#ifndef ZR_QUANT_IMPL_H
#define ZR_QUANT_IMPL_H

#include "zr/quant.h"

#include <math.h>
#include <string.h>

/*
 * How one group is coded. Encoding: t = v / div (sym) or (v - zero) / div
 * (asym), clamped to [lo, hi] in float, q = round_half_even(t). Decoding:
 * x' = q * scale (sym) or zero + q * scale (asym). A zero scale is coded with
 * div = 1 and lo = hi = 0 so that the same loop yields q = 0 without a
 * division by zero.
 */
typedef struct zr_qgroup {
    float div, lo, hi;
    float scale, zero;
    int bits; /* 8 or 4 */
    int asym;
} zr_qgroup;

/* Result of scanning a group: max of |v| as bits (>= 0x7f800000 means Inf/NaN), min and max. */
typedef struct zr_qscan {
    uint32_t absbits;
    float mn, mx;
} zr_qscan;

/* Where decoded values go. */
typedef enum zr_qout {
    ZR_QOUT_F32 = 0, /* store fp32 */
    ZR_QOUT_BF16,    /* store bf16 (round to nearest even) */
    ZR_QOUT_ADD,     /* fp32 acc[i] = acc[i] + x' */
} zr_qout;

/*
 * The kernels of one implementation. Pointers address the first element of
 * the segment (x, r and out already offset; payload at the segment's first
 * byte, which for 4 bits is element offset / 2 with an even element offset).
 * v = x * mul, then v = v + r when r is not NULL.
 */
typedef struct zr_qkernels {
    zr_qimpl impl;
    void (*scan)(zr_dtype t, const void *x, const float *r, size_t n, float mul, int asym,
                 zr_qscan *out);
    /* Writes the payload of the segment; with r, also r = v - x'. */
    void (*encode)(const zr_qgroup *g, zr_dtype t, const void *x, float *r, size_t n, float mul,
                   uint8_t *payload);
    void (*decode)(const zr_qgroup *g, const uint8_t *payload, size_t n, zr_qout mode, void *out);
} zr_qkernels;

extern const zr_qkernels zr_qkernels_scalar;
extern const zr_qkernels zr_qkernels_avx2;
extern const zr_qkernels zr_qkernels_avx512;

/* CPU support of the vector kernels (quant_x86.c); 0 where not built for x86. */
int zr_qkernels_avx2_ok(void);
int zr_qkernels_avx512_ok(void);

/* ---- per-element rules, shared by every implementation ------------------ */

static inline uint32_t zr_q_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float zr_q_bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* fp32 -> bf16, round to nearest even; NaN stays a quiet NaN with its sign. */
static inline zr_bf16 zr_q_bf16_round(float x)
{
    uint32_t u = zr_q_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (zr_bf16)((u >> 16) | 0x0040u);
    }
    /* adding 0x7fff plus the kept LSB rounds ties to even; a carry out of the
     * largest finite value lands on the Inf pattern, which is what we want */
    return (zr_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float zr_q_bf16_widen(zr_bf16 h)
{
    return zr_q_bits_f32((uint32_t)h << 16);
}

static inline float zr_q_value(zr_dtype t, const void *x, const float *r, size_t i, float mul)
{
    float v = t == ZR_DTYPE_BF16 ? zr_q_bf16_widen(((const zr_bf16 *)x)[i]) : ((const float *)x)[i];
    v = v * mul;
    if (r != NULL) {
        v = v + r[i];
    }
    return v;
}

static inline int zr_q_code(const zr_qgroup *g, float v)
{
    float t = g->asym ? (v - g->zero) / g->div : v / g->div;
    t = t < g->lo ? g->lo : t;
    t = t > g->hi ? g->hi : t;
    return (int)nearbyintf(t); /* the default rounding mode: half to even */
}

static inline float zr_q_dequant(const zr_qgroup *g, int q)
{
    float p = (float)q * g->scale;
    return g->asym ? g->zero + p : p;
}

/* Code of element i of a payload (8 or 4 bits, signed for sym). */
static inline int zr_q_payload_get(const zr_qgroup *g, const uint8_t *payload, size_t i)
{
    if (g->bits == 8) {
        return g->asym ? (int)payload[i] : (int)(int8_t)payload[i];
    }
    int nib = (payload[i / 2] >> ((i & 1) * 4)) & 0xf;
    return g->asym ? nib : (nib ^ 8) - 8;
}

#endif /* ZR_QUANT_IMPL_H */
