/*
 * optim_cuda.c - the C API of the optimizer's CUDA kernels (zr/optim.h):
 * argument checks, the step's constants (computed here exactly as for the
 * CPU) and the launches (adamw_cuda.cu). Compiled only where CUDA is built
 * (optim_nocuda.c stands in without); zr_sumsq_cuda_order, the CPU twin of
 * the kernels' order of addition, is optim.c's.
 */
#include "zr/optim.h"

#include "../base/device_impl.h"
#include "adamw_rules.h"
#include "optim_cuda_impl.h"

#include <string.h>

static zr_status cuda_stream(zr_stream *s, const char *what, cudaStream_t *out)
{
    *out = NULL;
    if (s == NULL || zr_stream_device(s)->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: needs a stream of a CUDA device, got %s", what,
                s == NULL ? "none" : "a CPU stream");
    }
    *out = zr_stream_cuda(s);
    return ZR_OK;
}

static int aligned16(const void *p)
{
    return (uintptr_t)p % 16 == 0;
}

zr_status zr_adamw_cuda_update(const zr_adamw *h, float lr, int t, float grad_scale, int decay,
                               float *param, const float *grad, float *m, float *v, size_t n,
                               zr_stream *s)
{
    const char *what = "adamw cuda update";
    if (h == NULL || t < 1 || ((param == NULL || grad == NULL || m == NULL || v == NULL) && n)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: needs hyperparameters, step t >= 1 (got %d) and 4 arrays",
                what, t);
    }
    cudaStream_t cs;
    ZR_CHECK(cuda_stream(s, what, &cs));
    if (n == 0) {
        return ZR_OK;
    }
    zr_adamw_k k =
        zr_adamw_consts(h->beta1, h->beta2, h->eps, h->weight_decay, lr, t, grad_scale, decay);
    int vec = aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v);
    ZR_CUDA_CHECK(zr_optim_k_launch_adamw(&k, param, grad, m, v, n, vec, cs));
    return ZR_OK;
}

zr_status zr_sumsq_cuda(const float *x, size_t n, double *result, double *work, zr_stream *s)
{
    const char *what = "sumsq cuda";
    if ((x == NULL && n > 0) || result == NULL || work == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: NULL %s", what,
                result == NULL ? "result"
                : work == NULL ? "work"
                               : "input");
    }
    cudaStream_t cs;
    ZR_CHECK(cuda_stream(s, what, &cs));
    ZR_CUDA_CHECK(zr_optim_k_launch_sumsq(x, n, aligned16(x), result, work, cs));
    return ZR_OK;
}
