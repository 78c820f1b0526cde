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
 * tests compare bit for bit against the oracle. The rules themselves live in
 * quant_rules.h, which the CUDA kernels (quant_cuda.cu) include too.
 *
 * Not installed; nothing outside src/quant includes it.
 */
#ifndef ZR_QUANT_IMPL_H
#define ZR_QUANT_IMPL_H

#include "zr/quant.h"

#include "quant_rules.h" /* zr_quant_group and the per-element rules, shared with the CUDA kernels */

#include <math.h>
#include <string.h>

/* Result of scanning a group: max of |v| as bits (>= 0x7f800000 means Inf/NaN), min and max. */
typedef struct zr_quant_scan {
    uint32_t absbits;
    float mn, mx;
} zr_quant_scan;

/* Where decoded values go. */
typedef enum zr_quant_out {
    ZR_QUANT_OUT_F32 = 0, /* store fp32 */
    ZR_QUANT_OUT_BF16,    /* store bf16 (round to nearest even) */
    ZR_QUANT_OUT_ADD,     /* fp32 acc[i] = acc[i] + x' */
} zr_quant_out;

/*
 * The kernels of one implementation. Pointers address the first element of
 * the segment (x, r and out already offset; payload at the segment's first
 * byte, which for 4 bits is element offset / 2 with an even element offset).
 * v = x * mul, then v = v + r when r is not NULL.
 */
typedef struct zr_quant_kernels {
    zr_quant_impl impl;
    void (*scan)(zr_dtype t, const void *x, const float *r, size_t n, float mul, int asym,
                 zr_quant_scan *out);
    /* Writes the payload of the segment; with r, also r = v - x'. */
    void (*encode)(const zr_quant_group *g, zr_dtype t, const void *x, float *r, size_t n,
                   float mul, uint8_t *payload);
    void (*decode)(const zr_quant_group *g, const uint8_t *payload, size_t n, zr_quant_out mode,
                   void *out);
} zr_quant_kernels;

extern const zr_quant_kernels zr_quant_kernels_scalar;
extern const zr_quant_kernels zr_quant_kernels_avx2;
extern const zr_quant_kernels zr_quant_kernels_avx512;

/* CPU support of the vector kernels (quant_x86.c); 0 where not built for x86. */
int zr_quant_kernels_avx2_ok(void);
int zr_quant_kernels_avx512_ok(void);

/* ---- per-element helpers over the rules of quant_rules.h ---------------- */

static inline float zr_quant_value(zr_dtype t, const void *x, const float *r, size_t i, float mul)
{
    float xi =
        t == ZR_DTYPE_BF16 ? zr_quant_bf16_widen(((const zr_bf16 *)x)[i]) : ((const float *)x)[i];
    return zr_quant_input(xi, mul, r != NULL, r != NULL ? r[i] : 0.0f);
}

/* Code of element i of a payload (8 or 4 bits, signed for sym). */
static inline int zr_quant_payload_get(const zr_quant_group *g, const uint8_t *payload, size_t i)
{
    if (g->bits == 8) {
        return zr_quant_unpack(8, g->asym, payload[i]);
    }
    return zr_quant_unpack(4, g->asym, (uint32_t)(payload[i / 2] >> ((i & 1) * 4)) & 0xfu);
}

#endif /* ZR_QUANT_IMPL_H */
