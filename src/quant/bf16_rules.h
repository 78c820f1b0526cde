/*
 * bf16_rules.h - the fp32 <-> bf16 conversion rules and fp32 bit casts,
 * shared by the CPU code (C11) and the CUDA kernels (nvcc and the GPU
 * emulator), so that every build rounds the same way (src/base/hd.h).
 *
 * The rounding is written with integer operations instead of the hardware's
 * bf16 conversion: it keeps a NaN's sign and payload (the hardware returns
 * its own canonical NaN), and integer operations give the same bits on every
 * processor. Valid C11 and CUDA C++; nothing here may depend on the build.
 */
#ifndef ZR_BF16_RULES_H
#define ZR_BF16_RULES_H

#include "../base/hd.h"

#include <stdint.h>
#include <string.h>

ZR_HD uint32_t zr_quant_f32_bits(float x)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

ZR_HD float zr_quant_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* fp32 -> bf16, round to nearest even; NaN stays a quiet NaN with its sign. */
ZR_HD uint16_t zr_quant_bf16_round(float x)
{
    uint32_t u = zr_quant_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x0040u);
    }
    /* adding 0x7fff plus the kept LSB rounds ties to even; a carry out of the
     * largest finite value lands on the Inf pattern, which is what we want */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* bf16 -> fp32 is exact: bf16 is the top half of an fp32. */
ZR_HD float zr_quant_bf16_widen(uint16_t h)
{
    return zr_quant_bits_f32((uint32_t)h << 16);
}

#endif /* ZR_BF16_RULES_H */
