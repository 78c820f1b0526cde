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
#define ZR_QUANT_FDIV(a, b) __fdiv_rn((a), (b))
#define ZR_QUANT_FRCP(a)    __frcp_rn(a)
#else
#define ZR_QUANT_FMUL(a, b) ((a) * (b))
#define ZR_QUANT_FADD(a, b) ((a) + (b))
#define ZR_QUANT_FSUB(a, b) ((a) - (b))
#define ZR_QUANT_FDIV(a, b) ((a) / (b))
#define ZR_QUANT_FRCP(a)    (1.0f / (a))
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

/* Bytes from a block's start to its payload: header, then one fp32 scale
 * per group (asym: a scale and a zero point). */
ZR_HD uint64_t zr_quant_payload_offset(int asym, uint64_t group, uint64_t count)
{
    return ZR_QUANT_HEADER_BYTES + (count + group - 1) / group * (asym ? 2u : 1u) * 4u;
}

/*
 * How one group is coded. Encoding: t = v * inv (sym) or (v - zero) * inv
 * (asym), clamped to [lo, hi] in float, q = round_half_even(t), where
 * inv = 1 / div is one correctly rounded reciprocal per group. Where that
 * reciprocal overflows (div below about 2^-128: a group of subnormal-sized
 * values), `recip` is 0 and the group is coded by division, t = v / div,
 * as every group was before the reciprocal (issue 42). Decoding:
 * x' = q * scale (sym) or zero + q * scale (asym). A zero scale is coded with
 * div = inv = 1 and lo = hi = 0 so that the same loop yields q = 0.
 * The codes of an input may differ from the division rule's by one where
 * v / div lies within an ulp of a half; the decoding is unchanged, so blocks
 * and residuals of either rule read the same.
 */
typedef struct zr_quant_group {
    float div, inv, lo, hi;
    float scale, zero;
    int bits; /* 8 or 4 */
    int asym;
    int recip; /* 1: t = v * inv; 0: inv overflowed, t = v / div */
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
 * The coding of a finite group from its scan: the largest |v| as bits, and
 * (asym) its min and max.
 */
ZR_HD zr_quant_group zr_quant_group_make(int bits, int asym, uint32_t absbits, float mn, float mx)
{
    zr_quant_group g;
    g.bits = bits;
    g.asym = asym;
    if (!asym) {
        g.scale = ZR_QUANT_FDIV(zr_quant_bits_f32(absbits), (float)(1 << (bits - 1)));
        g.zero = 0.0f;
        g.lo = -(float)(1 << (bits - 1));
        g.hi = (float)((1 << (bits - 1)) - 1);
    } else {
        /* + 0.0f turns -0 into +0: which zero a min/max reduction returns
         * depends on its order, and the zero point is stored */
        mn = ZR_QUANT_FADD(mn, 0.0f);
        mx = ZR_QUANT_FADD(mx, 0.0f);
        /* the range in double cannot overflow for finite min and max */
        g.scale = (float)(((double)mx - (double)mn) / (double)((1 << bits) - 1));
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
    g.inv = ZR_QUANT_FRCP(g.div);
    /* 1/div is at most 2^128 (rounded): Inf only for a subnormal div */
    g.recip = zr_quant_absbits(g.inv) < 0x7f800000u;
    return g;
}

/* t of v in a finite group, before clamping and rounding. */
ZR_HD float zr_quant_scaled(const zr_quant_group *g, float v)
{
    float d = g->asym ? ZR_QUANT_FSUB(v, g->zero) : v;
    return g->recip ? ZR_QUANT_FMUL(d, g->inv) : ZR_QUANT_FDIV(d, g->div);
}

/* The code of v in a finite group. */
ZR_HD int zr_quant_code(const zr_quant_group *g, float v)
{
    float t = zr_quant_scaled(g, v);
    t = t < g->lo ? g->lo : t;
    t = t > g->hi ? g->hi : t;
    return (int)nearbyintf(t); /* the default rounding mode: half to even */
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
