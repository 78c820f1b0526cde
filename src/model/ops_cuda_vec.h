/*
 * ops_cuda_vec.h - what the model's kernels (ops_cuda.cu, attention_cuda.cu)
 * share: one storage type per precision, and chunks of 8 elements moved with
 * 16-byte accesses where the C side found them aligned.
 *
 * Storage types: float (fp32 mode) or uint16_t holding bf16 bits (bf16
 * mode). Kernels compute in fp32 and convert with src/quant/bf16_rules.h,
 * the rule the CPU codec uses (round to nearest even). A chunk of 8 is two
 * float4 in fp32 and one uint4 in bf16, so every chunk that starts at a
 * multiple of 8 elements of a 16-byte aligned row is aligned in both.
 *
 * Device code only: included by .cu files after src/base/cuda_kernel.h.
 */
#ifndef ZR_OPS_CUDA_VEC_H
#define ZR_OPS_CUDA_VEC_H

#include "../base/cuda_kernel.h"
#include "../quant/bf16_rules.h"

#define ZR_FULL_MASK 0xffffffffu

typedef uint16_t zr_bf16_t; /* bf16 bits in device memory */

__device__ __forceinline__ float ld1(const float *p)
{
    return *p;
}
__device__ __forceinline__ float ld1(const zr_bf16_t *p)
{
    return zr_quant_bf16_widen(*p);
}
__device__ __forceinline__ void st1(float *p, float v)
{
    *p = v;
}
__device__ __forceinline__ void st1(zr_bf16_t *p, float v)
{
    *p = zr_quant_bf16_round(v);
}

/* v as the storage type keeps it: what a later read of the stored value gives. */
__device__ __forceinline__ float as_stored(float v, const float *)
{
    return v;
}
__device__ __forceinline__ float as_stored(float v, const zr_bf16_t *)
{
    return zr_quant_bf16_widen(zr_quant_bf16_round(v));
}

/* v[0..7] = p[0..m-1] (0 beyond m); one or two 16-byte loads when vec and m == 8. */
__device__ __forceinline__ void load8(const float *p, int m, bool vec, float v[8])
{
    if (vec && m == 8) {
        float4 a = reinterpret_cast<const float4 *>(p)[0];
        float4 b = reinterpret_cast<const float4 *>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        v[i] = i < m ? p[i] : 0.0f;
    }
}

__device__ __forceinline__ void load8(const zr_bf16_t *p, int m, bool vec, float v[8])
{
    if (vec && m == 8) {
        uint4 w = reinterpret_cast<const uint4 *>(p)[0];
        uint32_t ws[4] = {w.x, w.y, w.z, w.w};
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            v[i] = zr_quant_bf16_widen((uint16_t)(ws[i / 2] >> (16 * (i & 1))));
        }
        return;
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        v[i] = i < m ? zr_quant_bf16_widen(p[i]) : 0.0f;
    }
}

/* p[0..m-1] = v[0..m-1]; 16-byte stores when vec and m == 8. */
__device__ __forceinline__ void store8(float *p, int m, bool vec, const float v[8])
{
    if (vec && m == 8) {
        reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        if (i < m) {
            p[i] = v[i];
        }
    }
}

__device__ __forceinline__ void store8(zr_bf16_t *p, int m, bool vec, const float v[8])
{
    uint16_t h[8];
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        h[i] = zr_quant_bf16_round(v[i]);
    }
    if (vec && m == 8) {
        *reinterpret_cast<uint4 *>(p) =
            make_uint4(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16,
                       h[4] | (uint32_t)h[5] << 16, h[6] | (uint32_t)h[7] << 16);
        return;
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        if (i < m) {
            p[i] = h[i];
        }
    }
}

/* A pointer of the C side (void *) as the storage type, for the launchers. */
template <typename S> static inline S *sptr(void *p)
{
    return static_cast<S *>(p);
}
template <typename S> static inline const S *sptr(const void *p)
{
    return static_cast<const S *>(p);
}

/*
 * Sum over the `width` lanes of an aligned group (a power of two up to 32)
 * by an xor butterfly: every lane of the group gets the same bits (each
 * step adds the same two numbers in either order), so the result does not
 * depend on the lane. All 32 lanes of the warp must take part.
 */
template <int W> __device__ __forceinline__ float group_sum(float v)
{
    ZR_UNROLL
    for (int off = W / 2; off > 0; off /= 2) {
        v += __shfl_xor_sync(ZR_FULL_MASK, v, off);
    }
    return v;
}

#endif /* ZR_OPS_CUDA_VEC_H */
