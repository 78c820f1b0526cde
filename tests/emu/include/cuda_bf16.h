/*
 * cuda_bf16.h - the GPU emulator's bf16 type and conversions (tests/emu, issue 23).
 *
 * __nv_bfloat16 is the upper half of an IEEE binary32. float -> bf16 rounds
 * to nearest, ties to even, as cvt.rn.bf16.f32 does on sm_80+ and as the
 * toolkit's host code does: values that round past the largest bf16 become
 * Inf, denormals are kept (never flushed), and every NaN becomes the
 * canonical NaN 0x7FFF (its sign and payload are dropped; zr's CPU codec
 * keeps them, which is why zr's kernels convert with the shared rule in
 * src/quant/bf16_rules.h rather than with these). bf16 -> float is exact.
 */
#ifndef ZR_EMU_CUDA_BF16_H
#define ZR_EMU_CUDA_BF16_H

#include "cuda_runtime.h"

struct __nv_bfloat16_raw {
    unsigned short x;
};

namespace zr_emu {

inline unsigned short bf16_rn(float f)
{
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fffu;
    }
    /* adding 0x7fff plus the lowest kept bit rounds a tie to the even side;
     * the carry out of the largest finite value gives the Inf pattern */
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline unsigned short bf16_rz(float f)
{
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fffu;
    }
    return (unsigned short)(u >> 16);
}

inline float bf16_widen(unsigned short h)
{
    unsigned int u = (unsigned int)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

} // namespace zr_emu

struct __align__(2) __nv_bfloat16
{
    unsigned short __x;

    __nv_bfloat16() = default;
    constexpr __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
    __nv_bfloat16(float f) : __x(zr_emu::bf16_rn(f)) {}
    __nv_bfloat16 &operator=(const __nv_bfloat16_raw &r)
    {
        __x = r.x;
        return *this;
    }
    __nv_bfloat16 &operator=(float f)
    {
        __x = zr_emu::bf16_rn(f);
        return *this;
    }
    operator float() const
    {
        return zr_emu::bf16_widen(__x);
    }
    operator __nv_bfloat16_raw() const
    {
        return __nv_bfloat16_raw{__x};
    }
};

struct __align__(4) __nv_bfloat162
{
    __nv_bfloat16 x, y;

    __nv_bfloat162() = default;
    __nv_bfloat162(const __nv_bfloat16 &a, const __nv_bfloat16 &b) : x(a), y(b) {}
};

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
    return __nv_bfloat16(__nv_bfloat16_raw{u});
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h)
{
    return h.__x;
}
inline __nv_bfloat16 __short_as_bfloat16(short s)
{
    return __ushort_as_bfloat16((unsigned short)s);
}
inline short __bfloat16_as_short(__nv_bfloat16 h)
{
    return (short)h.__x;
}

inline __nv_bfloat16 __float2bfloat16(float f)
{
    return __ushort_as_bfloat16(zr_emu::bf16_rn(f));
}
inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    return __ushort_as_bfloat16(zr_emu::bf16_rn(f));
}
inline __nv_bfloat16 __float2bfloat16_rz(float f)
{
    return __ushort_as_bfloat16(zr_emu::bf16_rz(f));
}
inline float __bfloat162float(__nv_bfloat16 h)
{
    return zr_emu::bf16_widen(h.__x);
}

inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b)
{
    return __nv_bfloat162(a, b);
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
    return __nv_bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(b));
}
inline __nv_bfloat162 __float2bfloat162_rn(float a)
{
    return __floats2bfloat162_rn(a, a);
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v)
{
    return __floats2bfloat162_rn(v.x, v.y);
}
inline float2 __bfloat1622float2(__nv_bfloat162 v)
{
    return make_float2(__bfloat162float(v.x), __bfloat162float(v.y));
}
inline float __low2float(__nv_bfloat162 v)
{
    return __bfloat162float(v.x);
}
inline float __high2float(__nv_bfloat162 v)
{
    return __bfloat162float(v.y);
}
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 v)
{
    return v.x;
}
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 v)
{
    return v.y;
}

#endif /* ZR_EMU_CUDA_BF16_H */
