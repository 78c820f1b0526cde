/*
 * quant_x86.c - AVX2 and AVX-512 element loops of the block codec.
 *
 * Each kernel runs the same arithmetic as the scalar oracle (quant.c /
 * quant_impl.h) in the same order, one IEEE operation for one operation:
 * x * mul, + r, a product with the group's reciprocal (quant_rules.h), clamp,
 * round half to even, q * scale, v - x'. Nothing is contracted into an FMA
 * and the reciprocal is the rule's (computed once per group in scalar C), so
 * results are bit-identical to the scalar code; the last n % 16 elements of
 * a segment, and the rare groups of subnormal-sized values (recip 0), go to
 * the scalar kernel.
 *
 * The functions carry target attributes instead of relying on -march, so the
 * library runs on any x86-64 and picks a path at run time
 * (__builtin_cpu_supports). The build's -march=native only changes the
 * scalar code around them.
 */
#include "quant_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define T512          __attribute__((target("avx512f,avx512bw,avx512vl")))
#define T256          __attribute__((target("avx2,fma")))

int zr_quant_kernels_avx2_ok(void)
{
    __builtin_cpu_init();
    return zr_cpu_cap() >= ZR_CPU_AVX2 && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
}

int zr_quant_kernels_avx512_ok(void)
{
    __builtin_cpu_init();
    return zr_cpu_cap() >= ZR_CPU_AVX512 && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

/* ---- shared 128-bit helpers (SSE2 is baseline x86-64) -------------------- */

/* 16 bytes of codes (element i in byte i) -> 8 bytes of nibble pairs. */
static ALWAYS_INLINE __m128i nibble_pack(__m128i b)
{
    __m128i lo = _mm_and_si128(b, _mm_set1_epi16(0x000f));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi16(0x00f0));
    return _mm_packus_epi16(_mm_or_si128(lo, hi), _mm_setzero_si128());
}

/* 8 bytes of nibble pairs -> 16 bytes, element i in byte i, values 0..15. */
static ALWAYS_INLINE __m128i nibble_unpack(const uint8_t *p)
{
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    __m128i m = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(b, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm_unpacklo_epi8(lo, hi);
}

/* ======================= AVX-512: 16 lanes ================================ */

static T512 ALWAYS_INLINE __m512 load16(int bf16, const void *x, size_t i)
{
    if (bf16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const zr_bf16 *)x + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)x + i);
}

static T512 ALWAYS_INLINE __m512 value16(int bf16, const void *x, const float *r, size_t i,
                                         __m512 mul)
{
    __m512 v = _mm512_mul_ps(load16(bf16, x, i), mul);
    if (r != NULL) {
        v = _mm512_add_ps(v, _mm512_loadu_ps(r + i));
    }
    return v;
}

static T512 ALWAYS_INLINE void scan512_t(int bf16, int asym, const void *x, const float *r,
                                         size_t n, float mul, zr_quant_scan *out)
{
    size_t n16 = n & ~(size_t)15;
    __m512 vm = _mm512_set1_ps(mul);
    __m512i mask = _mm512_set1_epi32(0x7fffffff);
    __m512i amax0 = _mm512_setzero_si512(), amax1 = _mm512_setzero_si512();
    __m512 mn = _mm512_set1_ps(INFINITY), mx = _mm512_set1_ps(-INFINITY);
    size_t i = 0;
    /* two accumulators for the common symmetric case hide the max latency */
    if (!asym) {
        for (; i + 32 <= n16; i += 32) {
            __m512 a = value16(bf16, x, r, i, vm), b = value16(bf16, x, r, i + 16, vm);
            amax0 = _mm512_max_epu32(amax0, _mm512_and_si512(_mm512_castps_si512(a), mask));
            amax1 = _mm512_max_epu32(amax1, _mm512_and_si512(_mm512_castps_si512(b), mask));
        }
    }
    for (; i < n16; i += 16) {
        __m512 v = value16(bf16, x, r, i, vm);
        amax0 = _mm512_max_epu32(amax0, _mm512_and_si512(_mm512_castps_si512(v), mask));
        if (asym) {
            mn = _mm512_min_ps(mn, v);
            mx = _mm512_max_ps(mx, v);
        }
    }
    zr_quant_scan tail;
    zr_quant_kernels_scalar.scan(bf16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32,
                                 (const uint8_t *)x + n16 * (bf16 ? 2 : 4), r ? r + n16 : NULL,
                                 n - n16, mul, asym, &tail);
    uint32_t a = _mm512_reduce_max_epu32(_mm512_max_epu32(amax0, amax1));
    out->absbits = a > tail.absbits ? a : tail.absbits;
    if (asym) {
        /* finite values have one min and max whatever the order; +-0 and NaN
         * differences are erased by the caller (+0.0f, non-finite check) */
        float vmn = _mm512_reduce_min_ps(mn), vmx = _mm512_reduce_max_ps(mx);
        out->mn = tail.mn < vmn ? tail.mn : vmn;
        out->mx = tail.mx > vmx ? tail.mx : vmx;
    } else {
        out->mn = out->mx = 0.0f;
    }
}

static T512 void scan512(zr_dtype t, const void *x, const float *r, size_t n, float mul, int asym,
                         zr_quant_scan *out)
{
    int bf16 = t == ZR_DTYPE_BF16;
    if (bf16) {
        if (asym) {
            scan512_t(1, 1, x, r, n, mul, out);
        } else {
            scan512_t(1, 0, x, r, n, mul, out);
        }
    } else if (asym) {
        scan512_t(0, 1, x, r, n, mul, out);
    } else {
        scan512_t(0, 0, x, r, n, mul, out);
    }
}

static T512 ALWAYS_INLINE void encode512_t(int bf16, int asym, int bits, const zr_quant_group *g,
                                           const void *x, float *r, size_t n, float mul,
                                           uint8_t *payload)
{
    size_t n16 = n & ~(size_t)15;
    __m512 vm = _mm512_set1_ps(mul), inv = _mm512_set1_ps(g->inv);
    __m512 lo = _mm512_set1_ps(g->lo), hi = _mm512_set1_ps(g->hi);
    __m512 scale = _mm512_set1_ps(g->scale), zero = _mm512_set1_ps(g->zero);
    for (size_t i = 0; i < n16; i += 16) {
        __m512 v = value16(bf16, x, r, i, vm);
        __m512 t = _mm512_mul_ps(asym ? _mm512_sub_ps(v, zero) : v, inv);
        t = _mm512_min_ps(_mm512_max_ps(t, lo), hi);
        __m512i q = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (r != NULL) {
            __m512 xq = _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale);
            if (asym) {
                xq = _mm512_add_ps(zero, xq);
            }
            _mm512_storeu_ps(r + i, _mm512_sub_ps(v, xq));
        }
        __m128i b = _mm512_cvtepi32_epi8(q); /* truncation keeps the two's complement byte */
        if (bits == 8) {
            _mm_storeu_si128((__m128i *)(payload + i), b);
        } else {
            _mm_storel_epi64((__m128i *)(payload + i / 2), nibble_pack(b));
        }
    }
    zr_quant_kernels_scalar.encode(g, bf16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32,
                                   (const uint8_t *)x + n16 * (bf16 ? 2 : 4), r ? r + n16 : NULL,
                                   n - n16, mul, payload + (bits == 8 ? n16 : n16 / 2));
}

/* One instantiation per (input type, scheme, bits) so the loops carry no branches. */
#define ENC512(BF, AS, BI)                                                                         \
    static T512 void enc512_##BF##AS##BI(const zr_quant_group *g, const void *x, float *r,         \
                                         size_t n, float mul, uint8_t *payload)                    \
    {                                                                                              \
        encode512_t(BF, AS, BI, g, x, r, n, mul, payload);                                         \
    }
ENC512(0, 0, 8)
ENC512(0, 0, 4)
ENC512(0, 1, 8)
ENC512(0, 1, 4)
ENC512(1, 0, 8)
ENC512(1, 0, 4)
ENC512(1, 1, 8)
ENC512(1, 1, 4)

typedef void (*enc_fn)(const zr_quant_group *g, const void *x, float *r, size_t n, float mul,
                       uint8_t *payload);

static const enc_fn enc512_table[2][2][2] = {
    {{enc512_004, enc512_008}, {enc512_014, enc512_018}},
    {{enc512_104, enc512_108}, {enc512_114, enc512_118}},
};

static void encode512(const zr_quant_group *g, zr_dtype t, const void *x, float *r, size_t n,
                      float mul, uint8_t *payload)
{
    if (!g->recip) {
        zr_quant_kernels_scalar.encode(g, t, x, r, n, mul, payload); /* recip 0: (v * pre) * inv */
        return;
    }
    enc512_table[t == ZR_DTYPE_BF16][g->asym != 0][g->bits == 8](g, x, r, n, mul, payload);
}

static T512 ALWAYS_INLINE void store_bf16_16(zr_bf16 *dst, __m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i h = _mm512_mask_blend_epi32(nan, rounded, quiet);
    _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(h));
}

static T512 ALWAYS_INLINE void decode512_t(int asym, int bits, zr_quant_out mode,
                                           const zr_quant_group *g, const uint8_t *payload,
                                           size_t n, void *out)
{
    size_t n16 = n & ~(size_t)15;
    __m512 scale = _mm512_set1_ps(g->scale), zero = _mm512_set1_ps(g->zero);
    for (size_t i = 0; i < n16; i += 16) {
        __m512i q;
        if (bits == 8) {
            __m128i b = _mm_loadu_si128((const __m128i *)(payload + i));
            q = asym ? _mm512_cvtepu8_epi32(b) : _mm512_cvtepi8_epi32(b);
        } else {
            q = _mm512_cvtepu8_epi32(nibble_unpack(payload + i / 2));
            if (!asym) {
                q = _mm512_srai_epi32(_mm512_slli_epi32(q, 28), 28);
            }
        }
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale);
        if (asym) {
            v = _mm512_add_ps(zero, v);
        }
        if (mode == ZR_QUANT_OUT_F32) {
            _mm512_storeu_ps((float *)out + i, v);
        } else if (mode == ZR_QUANT_OUT_ADD) {
            float *acc = (float *)out + i;
            _mm512_storeu_ps(acc, _mm512_add_ps(_mm512_loadu_ps(acc), v));
        } else {
            store_bf16_16((zr_bf16 *)out + i, v);
        }
    }
    zr_quant_kernels_scalar.decode(g, payload + (bits == 8 ? n16 : n16 / 2), n - n16, mode,
                                   (uint8_t *)out + n16 * (mode == ZR_QUANT_OUT_BF16 ? 2 : 4));
}

#define DEC512(AS, BI, MO)                                                                         \
    static T512 void dec512_##AS##BI##MO(const zr_quant_group *g, const uint8_t *payload,          \
                                         size_t n, void *out)                                      \
    {                                                                                              \
        decode512_t(AS, BI, MO, g, payload, n, out);                                               \
    }
DEC512(0, 8, 0)
DEC512(0, 8, 1)
DEC512(0, 8, 2)
DEC512(0, 4, 0)
DEC512(0, 4, 1)
DEC512(0, 4, 2)
DEC512(1, 8, 0)
DEC512(1, 8, 1)
DEC512(1, 8, 2)
DEC512(1, 4, 0)
DEC512(1, 4, 1)
DEC512(1, 4, 2)

typedef void (*dec_fn)(const zr_quant_group *g, const uint8_t *payload, size_t n, void *out);

static const dec_fn dec512_table[2][2][3] = {
    {{dec512_040, dec512_041, dec512_042}, {dec512_080, dec512_081, dec512_082}},
    {{dec512_140, dec512_141, dec512_142}, {dec512_180, dec512_181, dec512_182}},
};

static void decode512(const zr_quant_group *g, const uint8_t *payload, size_t n, zr_quant_out mode,
                      void *out)
{
    dec512_table[g->asym != 0][g->bits == 8][mode](g, payload, n, out);
}

const zr_quant_kernels zr_quant_kernels_avx512 = {ZR_QUANT_IMPL_AVX512, scan512, encode512,
                                                  decode512};

/* ======================= AVX2: 2 x 8 lanes ================================= */

static T256 ALWAYS_INLINE __m256 load8(int bf16, const void *x, size_t i)
{
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const zr_bf16 *)x + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)x + i);
}

static T256 ALWAYS_INLINE __m256 value8(int bf16, const void *x, const float *r, size_t i,
                                        __m256 mul)
{
    __m256 v = _mm256_mul_ps(load8(bf16, x, i), mul);
    if (r != NULL) {
        v = _mm256_add_ps(v, _mm256_loadu_ps(r + i));
    }
    return v;
}

static T256 ALWAYS_INLINE uint32_t hmax_epu32_8(__m256i v)
{
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

static T256 ALWAYS_INLINE float hmin_ps_8(__m256 v)
{
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_shuffle_ps(m, m, 0x4e));
    m = _mm_min_ps(m, _mm_shuffle_ps(m, m, 0xb1));
    return _mm_cvtss_f32(m);
}

static T256 ALWAYS_INLINE float hmax_ps_8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_shuffle_ps(m, m, 0x4e));
    m = _mm_max_ps(m, _mm_shuffle_ps(m, m, 0xb1));
    return _mm_cvtss_f32(m);
}

static T256 ALWAYS_INLINE void scan256_t(int bf16, int asym, const void *x, const float *r,
                                         size_t n, float mul, zr_quant_scan *out)
{
    size_t n16 = n & ~(size_t)15;
    __m256 vm = _mm256_set1_ps(mul);
    __m256i mask = _mm256_set1_epi32(0x7fffffff);
    __m256i amax0 = _mm256_setzero_si256(), amax1 = _mm256_setzero_si256();
    __m256 mn = _mm256_set1_ps(INFINITY), mx = _mm256_set1_ps(-INFINITY);
    for (size_t i = 0; i < n16; i += 16) {
        __m256 a = value8(bf16, x, r, i, vm), b = value8(bf16, x, r, i + 8, vm);
        amax0 = _mm256_max_epu32(amax0, _mm256_and_si256(_mm256_castps_si256(a), mask));
        amax1 = _mm256_max_epu32(amax1, _mm256_and_si256(_mm256_castps_si256(b), mask));
        if (asym) {
            mn = _mm256_min_ps(mn, _mm256_min_ps(a, b));
            mx = _mm256_max_ps(mx, _mm256_max_ps(a, b));
        }
    }
    zr_quant_scan tail;
    zr_quant_kernels_scalar.scan(bf16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32,
                                 (const uint8_t *)x + n16 * (bf16 ? 2 : 4), r ? r + n16 : NULL,
                                 n - n16, mul, asym, &tail);
    uint32_t a = hmax_epu32_8(_mm256_max_epu32(amax0, amax1));
    out->absbits = a > tail.absbits ? a : tail.absbits;
    if (asym) {
        float vmn = hmin_ps_8(mn), vmx = hmax_ps_8(mx);
        out->mn = tail.mn < vmn ? tail.mn : vmn;
        out->mx = tail.mx > vmx ? tail.mx : vmx;
    } else {
        out->mn = out->mx = 0.0f;
    }
}

static T256 void scan256(zr_dtype t, const void *x, const float *r, size_t n, float mul, int asym,
                         zr_quant_scan *out)
{
    int bf16 = t == ZR_DTYPE_BF16;
    if (bf16) {
        if (asym) {
            scan256_t(1, 1, x, r, n, mul, out);
        } else {
            scan256_t(1, 0, x, r, n, mul, out);
        }
    } else if (asym) {
        scan256_t(0, 1, x, r, n, mul, out);
    } else {
        scan256_t(0, 0, x, r, n, mul, out);
    }
}

/* 8 codes of one half: v -> q (int32), with the residual update. */
static T256 ALWAYS_INLINE __m256i code8(int bf16, int asym, const void *x, float *r, size_t i,
                                        __m256 vm, __m256 inv, __m256 lo, __m256 hi, __m256 scale,
                                        __m256 zero)
{
    __m256 v = value8(bf16, x, r, i, vm);
    __m256 t = _mm256_mul_ps(asym ? _mm256_sub_ps(v, zero) : v, inv);
    t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
    __m256i q = _mm256_cvtps_epi32(t); /* MXCSR rounding: half to even, like nearbyintf */
    if (r != NULL) {
        __m256 xq = _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale);
        if (asym) {
            xq = _mm256_add_ps(zero, xq);
        }
        _mm256_storeu_ps(r + i, _mm256_sub_ps(v, xq));
    }
    return q;
}

static T256 ALWAYS_INLINE void encode256_t(int bf16, int asym, int bits, const zr_quant_group *g,
                                           const void *x, float *r, size_t n, float mul,
                                           uint8_t *payload)
{
    size_t n16 = n & ~(size_t)15;
    __m256 vm = _mm256_set1_ps(mul), inv = _mm256_set1_ps(g->inv);
    __m256 lo = _mm256_set1_ps(g->lo), hi = _mm256_set1_ps(g->hi);
    __m256 scale = _mm256_set1_ps(g->scale), zero = _mm256_set1_ps(g->zero);
    for (size_t i = 0; i < n16; i += 16) {
        __m256i q0 = code8(bf16, asym, x, r, i, vm, inv, lo, hi, scale, zero);
        __m256i q1 = code8(bf16, asym, x, r, i + 8, vm, inv, lo, hi, scale, zero);
        /* packs work per 128-bit lane: restore element order before the byte pack */
        __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xd8);
        __m128i w0 = _mm256_castsi256_si128(w), w1 = _mm256_extracti128_si256(w, 1);
        __m128i b = asym ? _mm_packus_epi16(w0, w1) : _mm_packs_epi16(w0, w1);
        if (bits == 8) {
            _mm_storeu_si128((__m128i *)(payload + i), b);
        } else {
            _mm_storel_epi64((__m128i *)(payload + i / 2), nibble_pack(b));
        }
    }
    zr_quant_kernels_scalar.encode(g, bf16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32,
                                   (const uint8_t *)x + n16 * (bf16 ? 2 : 4), r ? r + n16 : NULL,
                                   n - n16, mul, payload + (bits == 8 ? n16 : n16 / 2));
}

#define ENC256(BF, AS, BI)                                                                         \
    static T256 void enc256_##BF##AS##BI(const zr_quant_group *g, const void *x, float *r,         \
                                         size_t n, float mul, uint8_t *payload)                    \
    {                                                                                              \
        encode256_t(BF, AS, BI, g, x, r, n, mul, payload);                                         \
    }
ENC256(0, 0, 8)
ENC256(0, 0, 4)
ENC256(0, 1, 8)
ENC256(0, 1, 4)
ENC256(1, 0, 8)
ENC256(1, 0, 4)
ENC256(1, 1, 8)
ENC256(1, 1, 4)

static const enc_fn enc256_table[2][2][2] = {
    {{enc256_004, enc256_008}, {enc256_014, enc256_018}},
    {{enc256_104, enc256_108}, {enc256_114, enc256_118}},
};

static void encode256(const zr_quant_group *g, zr_dtype t, const void *x, float *r, size_t n,
                      float mul, uint8_t *payload)
{
    if (!g->recip) {
        zr_quant_kernels_scalar.encode(g, t, x, r, n, mul, payload); /* recip 0: (v * pre) * inv */
        return;
    }
    enc256_table[t == ZR_DTYPE_BF16][g->asym != 0][g->bits == 8](g, x, r, n, mul, payload);
}

static T256 ALWAYS_INLINE __m128i store_bf16_8_bits(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    /* |u| > Inf as signed compare: both sides are below 2^31 */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i h = _mm256_blendv_epi8(rounded, quiet, nan);
    /* values are 0..0xffff, so the unsigned saturating pack is exact */
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
    return _mm256_castsi256_si128(p);
}

static T256 ALWAYS_INLINE void put8(zr_quant_out mode, void *out, size_t i, __m256 v)
{
    if (mode == ZR_QUANT_OUT_F32) {
        _mm256_storeu_ps((float *)out + i, v);
    } else if (mode == ZR_QUANT_OUT_ADD) {
        float *acc = (float *)out + i;
        _mm256_storeu_ps(acc, _mm256_add_ps(_mm256_loadu_ps(acc), v));
    } else {
        _mm_storeu_si128((__m128i *)((zr_bf16 *)out + i), store_bf16_8_bits(v));
    }
}

static T256 ALWAYS_INLINE __m256 deq8(int asym, __m256i q, __m256 scale, __m256 zero)
{
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale);
    return asym ? _mm256_add_ps(zero, v) : v;
}

static T256 ALWAYS_INLINE void decode256_t(int asym, int bits, zr_quant_out mode,
                                           const zr_quant_group *g, const uint8_t *payload,
                                           size_t n, void *out)
{
    size_t n16 = n & ~(size_t)15;
    __m256 scale = _mm256_set1_ps(g->scale), zero = _mm256_set1_ps(g->zero);
    for (size_t i = 0; i < n16; i += 16) {
        __m128i b;
        if (bits == 8) {
            b = _mm_loadu_si128((const __m128i *)(payload + i));
        } else {
            b = nibble_unpack(payload + i / 2);
            if (!asym) {
                /* sign-extend the nibble inside its byte: (b ^ 8) - 8 */
                b = _mm_sub_epi8(_mm_xor_si128(b, _mm_set1_epi8(8)), _mm_set1_epi8(8));
            }
        }
        __m128i b1 = _mm_srli_si128(b, 8);
        __m256i q0 = asym ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b);
        __m256i q1 = asym ? _mm256_cvtepu8_epi32(b1) : _mm256_cvtepi8_epi32(b1);
        put8(mode, out, i, deq8(asym, q0, scale, zero));
        put8(mode, out, i + 8, deq8(asym, q1, scale, zero));
    }
    zr_quant_kernels_scalar.decode(g, payload + (bits == 8 ? n16 : n16 / 2), n - n16, mode,
                                   (uint8_t *)out + n16 * (mode == ZR_QUANT_OUT_BF16 ? 2 : 4));
}

#define DEC256(AS, BI, MO)                                                                         \
    static T256 void dec256_##AS##BI##MO(const zr_quant_group *g, const uint8_t *payload,          \
                                         size_t n, void *out)                                      \
    {                                                                                              \
        decode256_t(AS, BI, MO, g, payload, n, out);                                               \
    }
DEC256(0, 8, 0)
DEC256(0, 8, 1)
DEC256(0, 8, 2)
DEC256(0, 4, 0)
DEC256(0, 4, 1)
DEC256(0, 4, 2)
DEC256(1, 8, 0)
DEC256(1, 8, 1)
DEC256(1, 8, 2)
DEC256(1, 4, 0)
DEC256(1, 4, 1)
DEC256(1, 4, 2)

static const dec_fn dec256_table[2][2][3] = {
    {{dec256_040, dec256_041, dec256_042}, {dec256_080, dec256_081, dec256_082}},
    {{dec256_140, dec256_141, dec256_142}, {dec256_180, dec256_181, dec256_182}},
};

static void decode256(const zr_quant_group *g, const uint8_t *payload, size_t n, zr_quant_out mode,
                      void *out)
{
    dec256_table[g->asym != 0][g->bits == 8][mode](g, payload, n, out);
}

const zr_quant_kernels zr_quant_kernels_avx2 = {ZR_QUANT_IMPL_AVX2, scan256, encode256, decode256};

#else /* not x86-64: only the scalar oracle exists */

int zr_quant_kernels_avx2_ok(void)
{
    return 0;
}

int zr_quant_kernels_avx512_ok(void)
{
    return 0;
}

const zr_quant_kernels zr_quant_kernels_avx2 = {ZR_QUANT_IMPL_AVX2, NULL, NULL, NULL};
const zr_quant_kernels zr_quant_kernels_avx512 = {ZR_QUANT_IMPL_AVX512, NULL, NULL, NULL};

#endif
