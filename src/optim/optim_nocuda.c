/*
 * optim_nocuda.c - the CUDA calls of zr/optim.h in a build without CUDA (the
 * Makefile compiles it instead of optim_cuda.c): they fail at once.
 */
#include "zr/optim.h"

zr_status zr_adamw_cuda_update(const zr_adamw *h, float lr, int t, float grad_scale, int decay,
                               float *param, const float *grad, float *m, float *v, size_t n,
                               zr_stream *s)
{
    ZR_FAIL(ZR_ERR_DEVICE, "adamw cuda update: zr was built without CUDA");
}

zr_status zr_sumsq_cuda(const float *x, size_t n, double *result, double *work, zr_stream *s)
{
    ZR_FAIL(ZR_ERR_DEVICE, "sumsq cuda: zr was built without CUDA");
}
