/*
 * device_impl.h - what zr's CUDA host code shares with the device layer
 * (device.c): turning a CUDA runtime error into a zr_status, and the CUDA
 * stream behind a zr_stream.
 *
 * Internal, and unlike the other internal headers shared across layers: the
 * host wrappers of the kernels (src/quant, src/optim, later src/coll) include
 * it, which is a dependency downwards (base is below them all). Only
 * <cuda_runtime_api.h>, a C header, is included; nothing here exists in a
 * build without CUDA.
 */
#ifndef ZR_DEVICE_IMPL_H
#define ZR_DEVICE_IMPL_H

#include "zr/device.h"

#if ZR_CUDA
#include <cuda_runtime_api.h>

/*
 * Record a failed CUDA call as ZR_ERR_DEVICE: "<call> failed at
 * <file>:<line>: <the runtime's message> (<error name>)", and clear the
 * runtime's last error. Returns ZR_ERR_DEVICE.
 */
zr_status zr_cuda_fail(cudaError_t err, const char *call, const char *file, int line);

/* Propagate a failing CUDA runtime call as a zr_status. */
#define ZR_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        cudaError_t zr_ce_ = (call);                                                               \
        if (zr_ce_ != cudaSuccess) {                                                               \
            return zr_cuda_fail(zr_ce_, #call, __FILE__, __LINE__);                                \
        }                                                                                          \
    } while (0)

/* Same, storing the status and jumping to a cleanup label. */
#define ZR_CUDA_CHECK_GOTO(call, st, label)                                                        \
    do {                                                                                           \
        cudaError_t zr_ce_ = (call);                                                               \
        if (zr_ce_ != cudaSuccess) {                                                               \
            (st) = zr_cuda_fail(zr_ce_, #call, __FILE__, __LINE__);                                \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* The CUDA stream of s; s must be a stream of a CUDA device. */
cudaStream_t zr_stream_cuda(const zr_stream *s);

#endif /* ZR_CUDA */

#endif /* ZR_DEVICE_IMPL_H */
