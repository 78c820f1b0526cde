/*
 * quant_rules.h - the per-element and per-group rules of the block codec
 * (zr/quant.h), written once for the CPU code (C11: the scalar oracle, the
 * tails of the x86 vector paths) and the CUDA kernels (nvcc and the GPU
 * emulator), so that a block encoded on either decodes to the same bytes on
 * the other (src/base/hd.h says how one source serves both).
 *
 * Bit-identity rests on: every operation below is one correctly rounded IEEE
 * operation in the order written (the CPU builds with -ffp-contract=off and
 * no fast-math; on a GPU the arithmetic of these rules is spelled with the
 * round-to-nearest intrinsics, ZR_QUANT_FMUL and friends, which nvcc never
 * contracts into an FMA nor approximates, so the codec does not depend on
 * --fmad or --prec-div); rounding to an integer is nearbyintf in the default mode
 * (half to even); and the two places where processors disagree on NaNs are
 * spelled out: a non-finite group decodes to ZR_QUANT_QNAN_BITS, and an addition
 * involving a NaN returns the first NaN operand quieted (x86's rule; a GPU
 * would return its canonical NaN instead).
 */
#ifndef ZR_QUANT_RULES_H
#define ZR_QUANT_RULES_H

#include "bf16_rules.h"

#include <math.h>

/* One IEEE operation each, never contracted into an FMA on either side. */
#ifdef __CUDA_ARCH__
#define ZR_QUANT_FMUL(a, b) __fmul_rn((a), (b))
#define ZR_QUANT_FADD(a, b) __fadd_rn((a), (b))
#define ZR_QUANT_FSUB(a, b) __fsub_rn((a), (b))
#else
#define ZR_QUANT_FMUL(a, b) ((a) * (b))
#define ZR_QUANT_FADD(a, b) ((a) + (b))
#define ZR_QUANT_FSUB(a, b) ((a) - (b))
#endif

/* the one NaN written as a scale and decoded from a non-finite group */
#define ZR_QUANT_QNAN_BITS 0x7fc00000u

/* ---- the wire block's layout (zr/quant.h) --------------------------------- */

/* zr/quant.h's definition repeated token for token (C and C++ allow an
 * identical redefinition; the compiler reports any other) */
#define ZR_QUANT_MAGIC        0x3151525au
#define ZR_QUANT_HEADER_BYTES 32u /* = sizeof(zr_quant_header) */

/* A group size the format allows: a multiple of 8 in 32..65536. */
ZR_HD int zr_quant_group_ok(uint64_t group)
{
    return group >= 32 && group <= 65536 && group % 8 == 0;
}

/*
 * e / group for a group of the format (<= 65536), by 32-bit divisions of
 * 16-bit digits: on a GPU a 64-bit division is a called routine whose
 * register saves spill in the codec's kernels.
 */
ZR_HD uint64_t zr_quant_div_group(uint64_t e, uint32_t group)
{
    if (e >> 32 == 0) {
        return (uint32_t)e / group;
    }
    uint64_t q = 0, rem = 0;
    for (int k = 3; k >= 0; k--) {
        uint32_t cur = (uint32_t)(rem << 16) | ((uint32_t)(e >> (16 * k)) & 0xffffu);
        q = q << 16 | cur / group;
        rem = cur % group;
    }
    return q;
}

/* Bytes from a block's start to its payload: header, then one fp32 scale
 * per group (asym: a scale and a zero point). */
ZR_HD uint64_t zr_quant_payload_offset(int asym, uint64_t group, uint64_t count)
{
    uint64_t ngroups = zr_quant_div_group(count + group - 1, (uint32_t)group);
    return ZR_QUANT_HEADER_BYTES + ngroups * (asym ? 2u : 1u) * 4u;
}

/*
 * How one group is coded. Encoding: t = v * inv (sym) or (v - zero) * inv
 * (asym), clamped to [lo, hi] in float, q = round_half_even(t), where
 * inv = 1 / div is one correctly rounded reciprocal per group (issue 42;
 * before, every element was divided by div). For a subnormal div (a group
 * of subnormal-sized values) `recip` is 0, pre = 2^64, inv = 1 / (div *
 * 2^64) and t = (v * 2^64) * inv (asym: (v - zero) * 2^64 * inv); both
 * products by 2^64 are exact there, and no element is ever divided. Decoding:
 * x' = q * scale (sym) or zero + q * scale (asym). A zero scale is coded with
 * div = inv = 1 and lo = hi = 0 so that the same loop yields q = 0.
 * The codes of an input may differ from the division rule's by one where
 * v / div lies within an ulp of a half; the decoding is unchanged, so blocks
 * and residuals of either rule read the same.
 */
typedef struct zr_quant_group {
    float div, inv, pre, lo, hi;
    float scale, zero;
    int bits; /* 8 or 4 */
    int asym;
    int recip; /* 1: t = v * inv; 0: 1/div overflowed, t = (v * pre) * inv */
} zr_quant_group;

/* The value quantized: x * mul, then + r with error feedback. */
ZR_HD float zr_quant_input(float x, float mul, int has_r, float r)
{
    float v = ZR_QUANT_FMUL(x, mul);
    if (has_r) {
        v = ZR_QUANT_FADD(v, r);
    }
    return v;
}

/* |v| as bits: integer order of these is the order of |v|, with NaN above Inf. */
ZR_HD uint32_t zr_quant_absbits(float v)
{
    return zr_quant_f32_bits(v) & 0x7fffffffu;
}

/* A group whose largest |v| (as bits) is Inf or NaN is non-finite. */
ZR_HD int zr_quant_nonfinite(uint32_t absbits)
{
    return absbits >= 0x7f800000u;
}

/*
 * 1/d correctly rounded from y0, an approximation within a few float ulps,
 * for a normal d: two Newton steps in double (each one FMA rounding) leave a
 * relative error near 2^-52, and 1/d of a float d is never closer than
 * 2^-49 (relative) to a float rounding midpoint, so the conversion to float
 * rounds as 1/d would (test_quant checks this with y0 a few ulps off).
 */
ZR_HD float zr_quant_rcp_refine(float d, float y0)
{
    double dd = (double)d, y = (double)y0;
#ifdef __CUDA_ARCH__
    y = __fma_rn(y, __fma_rn(-dd, y, 1.0), y);
    y = __fma_rn(y, __fma_rn(-dd, y, 1.0), y);
    return __double2float_rn(y);
#else
    y = fma(y, fma(-dd, y, 1.0), y);
    y = fma(y, fma(-dd, y, 1.0), y);
    return (float)y;
#endif
}

/*
 * The correctly rounded 1/d of a normal d below 2^126. A GPU's __frcp_rn
 * calls a routine for operands out of that range, and the call's register
 * saves spill in the codec's kernels: there the approximate reciprocal
 * (__fdividef) is refined instead, to the same bits.
 */
ZR_HD float zr_quant_rcp(float d)
{
#ifdef __CUDA_ARCH__
    return zr_quant_rcp_refine(d, __fdividef(1.0f, d));
#else
    return 1.0f / d;
#endif
}

/*
 * The coding of a finite group from its scan: the largest |v| as bits, and
 * (asym) its min and max.
 */
ZR_HD zr_quant_group zr_quant_group_make(int bits, int asym, uint32_t absbits, float mn, float mx)
{
    zr_quant_group g;
    g.bits = bits;
    g.asym = asym;
    if (!asym) {
        /* / 2^(bits-1) as a product: the same correctly rounded value */
        g.scale = ZR_QUANT_FMUL(zr_quant_bits_f32(absbits), bits == 8 ? 0x1p-7f : 0x1p-3f);
        g.zero = 0.0f;
        g.lo = -(float)(1 << (bits - 1));
        g.hi = (float)((1 << (bits - 1)) - 1);
    } else {
        /* + 0.0f turns -0 into +0: which zero a min/max reduction returns
         * depends on its order, and the zero point is stored */
        mn = ZR_QUANT_FADD(mn, 0.0f);
        mx = ZR_QUANT_FADD(mx, 0.0f);
        /* the range in double cannot overflow for finite min and max; times
         * the double nearest 1/(2^bits - 1), not divided (issue 42: a GPU's
         * double division is a called routine), then rounded to float */
        double r = (double)mx - (double)mn;
        g.scale = (float)(r * (bits == 8 ? 1.0 / 255.0 : 1.0 / 15.0));
        g.zero = mn;
        g.lo = 0.0f;
        g.hi = (float)((1 << bits) - 1);
    }
    g.div = g.scale;
    if (g.scale == 0.0f) {
        /* absmax 0 (or a range so small that the scale underflows): every
         * code is 0 and the decoded group is exactly zero (sym) or min (asym) */
        g.div = 1.0f;
        g.lo = g.hi = 0.0f;
    }
    g.recip = g.div >= 0x1p-126f; /* normal: then 1/div is too */
    g.pre = g.recip ? 1.0f : 0x1p64f;
    g.inv = zr_quant_rcp(ZR_QUANT_FMUL(g.div, g.pre));
    return g;
}

/* t of v in a finite group, before clamping and rounding. */
ZR_HD float zr_quant_scaled(const zr_quant_group *g, float v)
{
    float d = g->asym ? ZR_QUANT_FSUB(v, g->zero) : v;
    return ZR_QUANT_FMUL(g->recip ? d : ZR_QUANT_FMUL(d, g->pre), g->inv);
}

/*
 * t clamped to [lo, hi] and rounded half to even. t is never NaN in a finite
 * group (v finite, inv finite and positive, div positive), so a GPU's
 * fminf/fmaxf and __float2int_rn (one instruction each) give the CPU's
 * comparisons and nearbyintf, up to the sign of a zero that rounding drops.
 */
ZR_HD int zr_quant_clamp_round(const zr_quant_group *g, float t)
{
#ifdef __CUDA_ARCH__
    return __float2int_rn(fminf(fmaxf(t, g->lo), g->hi));
#else
    t = t < g->lo ? g->lo : t;
    t = t > g->hi ? g->hi : t;
    return (int)nearbyintf(t); /* the default rounding mode: half to even */
#endif
}

/* The code of v in a finite group. */
ZR_HD int zr_quant_code(const zr_quant_group *g, float v)
{
    return zr_quant_clamp_round(g, zr_quant_scaled(g, v));
}

/* The bits of a code in the payload: a byte (8 bits) or a nibble (4 bits). */
ZR_HD uint32_t zr_quant_pack(int bits, int q)
{
    return (uint32_t)q & (bits == 8 ? 0xffu : 0xfu);
}

/* The code stored in a byte or nibble (signed for sym). */
ZR_HD int zr_quant_unpack(int bits, int asym, uint32_t stored)
{
    if (bits == 8) {
        return asym ? (int)stored : (int)(int8_t)(uint8_t)stored;
    }
    return asym ? (int)stored : (int)(stored ^ 8u) - 8;
}

/* x' of code q in a finite group. */
ZR_HD float zr_quant_dequant(const zr_quant_group *g, int q)
{
    float p = ZR_QUANT_FMUL((float)q, g->scale);
    return g->asym ? ZR_QUANT_FADD(g->zero, p) : p;
}

/* A decoded group is non-finite when its stored scale is NaN. */
ZR_HD int zr_quant_scale_nonfinite(float scale)
{
    return scale != scale;
}

/* x' of element with code q: ZR_QUANT_QNAN_BITS for a non-finite group. */
ZR_HD float zr_quant_decode1(const zr_quant_group *g, int q)
{
    return zr_quant_scale_nonfinite(g->scale) ? zr_quant_bits_f32(ZR_QUANT_QNAN_BITS)
                                              : zr_quant_dequant(g, q);
}

/* a + b, where a NaN operand (the first one if both) is returned quieted. */
ZR_HD float zr_quant_add(float a, float b)
{
    if (a != a) {
        return zr_quant_bits_f32(zr_quant_f32_bits(a) | 0x00400000u);
    }
    if (b != b) {
        return zr_quant_bits_f32(zr_quant_f32_bits(b) | 0x00400000u);
    }
    return ZR_QUANT_FADD(a, b);
}

#endif /* ZR_QUANT_RULES_H */
