/*
 * attention_impl.h - the tile product behind attention.c, shared with its
 * vector versions in attention_x86.c. Internal to src/model.
 *
 * One product serves all five of attention's: S = Q K^T, O += P V,
 * dP = dO V^T, dV += P^T dO, dQ += dS K and dK += dS^T Q, with A read
 * through two strides (rows and the summed index) so that a transposed
 * operand needs no copy, and B read by rows. Every element of C is one
 * chain of fused multiply-adds over p = 0, 1, ..., k-1, rounded once per
 * step (fmaf): vector code spreads different elements over lanes, never one
 * element's sum, so every width gives the bits of the plain loop in
 * attention.c.
 */
#ifndef ZR_MODEL_ATTENTION_IMPL_H
#define ZR_MODEL_ATTENTION_IMPL_H

#include <stddef.h>

/*
 * C[i][j] = (acc ? C[i][j] : 0) + sum over p < k of A(i, p) * B[p][j], for
 * i < m, j < n, as c = fmaf(A(i, p), B[p][j], c) in increasing p, where
 * A(i, p) = a[i * ars + p * aps], B[p][j] = b[p * ldb + j] and C[i][j] =
 * c[i * ldc + j].
 */
typedef void (*zr_att_gemm_fn)(int m, int n, int k, const float *a, size_t ars, size_t aps,
                               const float *b, size_t ldb, float *c, size_t ldc, int acc);

void zr_att_gemm_scalar(int m, int n, int k, const float *a, size_t ars, size_t aps, const float *b,
                        size_t ldb, float *c, size_t ldc, int acc);

/* NULL where the CPU or the compiler lacks the instructions. */
zr_att_gemm_fn zr_att_gemm_avx2(void);
zr_att_gemm_fn zr_att_gemm_avx512(void);

#endif
