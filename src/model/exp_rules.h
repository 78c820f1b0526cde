/*
 * exp_rules.h - zr's exp, written once for the CPU's loops (ops_math.h, which
 * every CPU path of the model includes) and the CUDA kernels that must give
 * the CPU's bits (llama_rules.h): valid C11 and CUDA C++ (src/base/hd.h).
 * Always inlined on the host, so a caller compiled for AVX2 or AVX-512
 * vectorizes it at its width with the same operations.
 */
#ifndef ZR_MODEL_EXP_RULES_H
#define ZR_MODEL_EXP_RULES_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define ZR_EXP_INLINE static inline __host__ __device__
#else
#define ZR_EXP_INLINE static inline __attribute__((always_inline))
#endif

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
 * attention_x86.c repeats these operations with intrinsics, one for one;
 * llama_cuda.cu's SiLU calls this one (through llama_rules.h).
 */
ZR_EXP_INLINE float zr_exp_approx(float x)
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
#ifdef __CUDA_ARCH__
    float scale = __uint_as_float(bits);
#else
    float scale;
    memcpy(&scale, &bits, sizeof scale);
#endif
    return x == x ? p * scale : x;
}

#endif /* ZR_MODEL_EXP_RULES_H */
