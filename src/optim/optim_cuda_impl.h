/*
 * optim_cuda_impl.h - the seam between the optimizer's CUDA kernels
 * (adamw_cuda.cu, C++) and their C API (optim_cuda.c, zr/optim.h): the
 * launchers, which queue the work on a stream and return the runtime's
 * status. Not installed; only src/optim includes it. Exists only with CUDA.
 */
#ifndef ZR_OPTIM_CUDA_IMPL_H
#define ZR_OPTIM_CUDA_IMPL_H

#include "adamw_rules.h"

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* AdamW on n elements; vec: the four arrays are 16-byte aligned. */
cudaError_t zr_optim_k_launch_adamw(const zr_adamw_k *k, float *p, const float *g, float *m,
                                    float *v, uint64_t n, int vec, cudaStream_t s);

/* Sum of squares of n elements into *result, with work[ZR_SUMSQ_BLOCKS] partials. */
cudaError_t zr_optim_k_launch_sumsq(const float *x, uint64_t n, int vec, double *result,
                                    double *work, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* ZR_OPTIM_CUDA_IMPL_H */
