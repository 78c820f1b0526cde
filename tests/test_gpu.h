/*
 * test_gpu.h - the device and stream of a single-process GPU test, and its
 * host <-> device copies in a storage type (fp32, or bf16 rounded from and
 * widened to fp32). Included after test.h by the kernel tests that compare
 * device buffers with the CPU operators (test_gpu_gemm_epi).
 */
#ifndef ZR_TEST_GPU_H
#define ZR_TEST_GPU_H

#include "test.h"
#include "zr/device.h"
#include "zr/quant.h" /* zr_dtype, the bf16 conversions */

static zr_device gpu;
static zr_stream *st;

/* A device copy of x[0..n-1] in storage type t (bf16: rounded). */
static inline void *dput(const float *x, size_t n, zr_dtype t)
{
    void *d = NULL;
    size_t es = zr_dtype_size(t);
    TEST_OK(zr_device_alloc_at(&gpu, &d, n * es + 16, __FILE__, __LINE__));
    void *h = malloc(n * es + 1);
    if (t == ZR_DTYPE_BF16) {
        zr_bf16_from_f32_n(h, x, n);
    } else {
        memcpy(h, x, n * es);
    }
    TEST_OK(zr_memcpy_async(d, h, n * es, st));
    TEST_OK(zr_stream_sync(st));
    free(h);
    return d;
}

/* x[0..n-1] = the device buffer, widened to fp32. */
static inline void dget(float *x, const void *d, size_t n, zr_dtype t)
{
    size_t es = zr_dtype_size(t);
    void *h = malloc(n * es + 1);
    TEST_OK(zr_memcpy_async(h, d, n * es, st));
    TEST_OK(zr_stream_sync(st));
    if (t == ZR_DTYPE_BF16) {
        zr_bf16_to_f32_n(x, h, n);
    } else {
        memcpy(x, h, n * es);
    }
    free(h);
}

#endif
