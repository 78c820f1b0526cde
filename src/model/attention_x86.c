/*
 * attention_x86.c - the tile product of attention_impl.h with AVX2+FMA and
 * AVX-512 registers.
 *
 * A block of MR rows by two vectors of columns is held in registers while
 * p runs over the summed index: each step broadcasts A(i, p) for the MR
 * rows, loads two vectors of B's row p and issues 2 MR fused multiply-adds.
 * Each lane is one element of C and sees exactly the chain of the scalar
 * loop (zr_att_gemm_scalar), so the bits are the same; columns left over
 * after the last whole vector run the same chain one element at a time.
 *
 * Target attributes instead of -march, and a run-time check of the CPU
 * (__builtin_cpu_supports), as in src/quant: a portable build runs the
 * widest kernel the machine has.
 */
#include "attention_impl.h"
#include "zr/base.h"

#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define T256          __attribute__((target("avx2,fma")))
#define T512          __attribute__((target("avx512f,avx2,fma")))

/* The columns no whole vector covers, one chain per element. */
static ALWAYS_INLINE void tail_cols(int mr, int j0, int n, int k, const float *a, size_t ars,
                                    size_t aps, const float *b, size_t ldb, float *c, size_t ldc,
                                    int acc)
{
    for (int r = 0; r < mr; r++) {
        for (int j = j0; j < n; j++) {
            float s = acc ? c[r * ldc + j] : 0.0f;
            for (int p = 0; p < k; p++) {
                s = fmaf(a[r * ars + p * aps], b[p * ldb + j], s);
            }
            c[r * ldc + j] = s;
        }
    }
}

/* ======================= AVX2: 6 rows x 16 columns ========================== */

/* 12 accumulators, 2 vectors of B and a broadcast: 15 of the 16 registers */
#define MR256 6

static T256 ALWAYS_INLINE void rows256(const int mr, int n, int k, const float *a, size_t ars,
                                       size_t aps, const float *b, size_t ldb, float *c, size_t ldc,
                                       int acc)
{
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256 c0[MR256], c1[MR256];
        for (int r = 0; r < mr; r++) {
            c0[r] = acc ? _mm256_loadu_ps(c + r * ldc + j) : _mm256_setzero_ps();
            c1[r] = acc ? _mm256_loadu_ps(c + r * ldc + j + 8) : _mm256_setzero_ps();
        }
        for (int p = 0; p < k; p++) {
            const float *bp = b + p * ldb + j;
            __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
            for (int r = 0; r < mr; r++) {
                __m256 ar = _mm256_broadcast_ss(a + r * ars + p * aps);
                c0[r] = _mm256_fmadd_ps(ar, b0, c0[r]);
                c1[r] = _mm256_fmadd_ps(ar, b1, c1[r]);
            }
        }
        for (int r = 0; r < mr; r++) {
            _mm256_storeu_ps(c + r * ldc + j, c0[r]);
            _mm256_storeu_ps(c + r * ldc + j + 8, c1[r]);
        }
    }
    for (; j + 8 <= n; j += 8) {
        __m256 c0[MR256];
        for (int r = 0; r < mr; r++) {
            c0[r] = acc ? _mm256_loadu_ps(c + r * ldc + j) : _mm256_setzero_ps();
        }
        for (int p = 0; p < k; p++) {
            __m256 b0 = _mm256_loadu_ps(b + p * ldb + j);
            for (int r = 0; r < mr; r++) {
                c0[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r * ars + p * aps), b0, c0[r]);
            }
        }
        for (int r = 0; r < mr; r++) {
            _mm256_storeu_ps(c + r * ldc + j, c0[r]);
        }
    }
    tail_cols(mr, j, n, k, a, ars, aps, b, ldb, c, ldc, acc);
}

static T256 void gemm256(int m, int n, int k, const float *a, size_t ars, size_t aps,
                         const float *b, size_t ldb, float *c, size_t ldc, int acc)
{
    int i = 0;
    for (; i + MR256 <= m; i += MR256) {
        rows256(MR256, n, k, a + i * ars, ars, aps, b, ldb, c + i * ldc, ldc, acc);
    }
    /* the last rows, with the row count a constant in each copy */
    const float *ai = a + i * ars;
    float *ci = c + i * ldc;
    switch (m - i) {
    case 5:
        rows256(5, n, k, ai, ars, aps, b, ldb, ci, ldc, acc);
        break;
    case 4:
        rows256(4, n, k, ai, ars, aps, b, ldb, ci, ldc, acc);
        break;
    case 3:
        rows256(3, n, k, ai, ars, aps, b, ldb, ci, ldc, acc);
        break;
    case 2:
        rows256(2, n, k, ai, ars, aps, b, ldb, ci, ldc, acc);
        break;
    case 1:
        rows256(1, n, k, ai, ars, aps, b, ldb, ci, ldc, acc);
        break;
    default:
        break;
    }
}

zr_att_gemm_fn zr_att_gemm_avx2(void)
{
    __builtin_cpu_init();
    return zr_cpu_cap() >= ZR_CPU_AVX2 && __builtin_cpu_supports("avx2") &&
                   __builtin_cpu_supports("fma")
               ? gemm256
               : NULL;
}

/* ======================= AVX-512: 8 rows x 32 columns ======================= */

#define MR512 8

static T512 ALWAYS_INLINE void rows512(const int mr, int n, int k, const float *a, size_t ars,
                                       size_t aps, const float *b, size_t ldb, float *c, size_t ldc,
                                       int acc)
{
    int j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512 c0[MR512], c1[MR512];
        for (int r = 0; r < mr; r++) {
            c0[r] = acc ? _mm512_loadu_ps(c + r * ldc + j) : _mm512_setzero_ps();
            c1[r] = acc ? _mm512_loadu_ps(c + r * ldc + j + 16) : _mm512_setzero_ps();
        }
        for (int p = 0; p < k; p++) {
            const float *bp = b + p * ldb + j;
            __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
            for (int r = 0; r < mr; r++) {
                __m512 ar = _mm512_set1_ps(a[r * ars + p * aps]);
                c0[r] = _mm512_fmadd_ps(ar, b0, c0[r]);
                c1[r] = _mm512_fmadd_ps(ar, b1, c1[r]);
            }
        }
        for (int r = 0; r < mr; r++) {
            _mm512_storeu_ps(c + r * ldc + j, c0[r]);
            _mm512_storeu_ps(c + r * ldc + j + 16, c1[r]);
        }
    }
    for (; j + 16 <= n; j += 16) {
        __m512 c0[MR512];
        for (int r = 0; r < mr; r++) {
            c0[r] = acc ? _mm512_loadu_ps(c + r * ldc + j) : _mm512_setzero_ps();
        }
        for (int p = 0; p < k; p++) {
            __m512 b0 = _mm512_loadu_ps(b + p * ldb + j);
            for (int r = 0; r < mr; r++) {
                c0[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * ars + p * aps]), b0, c0[r]);
            }
        }
        for (int r = 0; r < mr; r++) {
            _mm512_storeu_ps(c + r * ldc + j, c0[r]);
        }
    }
    tail_cols(mr, j, n, k, a, ars, aps, b, ldb, c, ldc, acc);
}

static T512 void gemm512(int m, int n, int k, const float *a, size_t ars, size_t aps,
                         const float *b, size_t ldb, float *c, size_t ldc, int acc)
{
    int i = 0;
    for (; i + MR512 <= m; i += MR512) {
        rows512(MR512, n, k, a + i * ars, ars, aps, b, ldb, c + i * ldc, ldc, acc);
    }
    for (; i < m; i++) {
        rows512(1, n, k, a + i * ars, ars, aps, b, ldb, c + i * ldc, ldc, acc);
    }
}

zr_att_gemm_fn zr_att_gemm_avx512(void)
{
    __builtin_cpu_init();
    return zr_cpu_cap() >= ZR_CPU_AVX512 && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("fma")
               ? gemm512
               : NULL;
}

#else

zr_att_gemm_fn zr_att_gemm_avx2(void)
{
    return NULL;
}

zr_att_gemm_fn zr_att_gemm_avx512(void)
{
    return NULL;
}

#endif
