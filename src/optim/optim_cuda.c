/*
 * optim_cuda.c - the C API of the optimizer's CUDA kernels (zr/optim.h):
 * argument checks, the step's constants (computed here exactly as for the
 * CPU), the launches (adamw_cuda.cu), and zr_sumsq_cuda_order, the CPU twin
 * of the kernels' order of addition (sumsq_rules.h) that tests check the
 * GPU's sum against. In a build without CUDA the device calls fail at once.
 */
#include "zr/optim.h"

#include "../base/device_impl.h"
#include "adamw_rules.h"
#include "sumsq_rules.h"

#include <string.h>

double zr_sumsq_cuda_order(const float *x, size_t n)
{
    uint64_t parts = zr_sumsq_partials(n);
    uint64_t tiles = (n + ZR_SUMSQ_TILE - 1) / ZR_SUMSQ_TILE;
    static double part[ZR_SUMSQ_BLOCKS], s[ZR_SUMSQ_THREADS];
    for (uint64_t b = 0; b < parts; b++) {
        for (int i = 0; i < ZR_SUMSQ_THREADS; i++) {
            double acc = 0.0;
            for (uint64_t t = b; t < tiles; t += parts) {
                for (int j = 0; j < 4; j++) {
                    uint64_t e = t * ZR_SUMSQ_TILE + (uint64_t)j * 4 * ZR_SUMSQ_THREADS + 4u * i;
                    for (uint64_t k = e; k < e + 4 && k < n; k++) {
                        acc = zr_sumsq_add(acc, x[k]);
                    }
                }
            }
            s[i] = acc;
        }
        for (int h = ZR_SUMSQ_THREADS / 2; h > 0; h /= 2) {
            for (int i = 0; i < h; i++) {
                s[i] = s[i] + s[i + h];
            }
        }
        part[b] = s[0];
    }
    for (uint64_t b = parts; b < ZR_SUMSQ_BLOCKS; b++) {
        part[b] = 0.0;
    }
    for (int h = ZR_SUMSQ_BLOCKS / 2; h > 0; h /= 2) {
        for (int i = 0; i < h; i++) {
            part[i] = part[i] + part[i + h];
        }
    }
    return part[0];
}

#if ZR_CUDA

#include "optim_cuda_impl.h"

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

#else /* !ZR_CUDA */

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

#endif /* ZR_CUDA */
