/*
 * device_impl.h - what zr's CUDA host code shares with the device layer
 * (device.c): turning a CUDA runtime error into a zr_status, and the CUDA
 * stream behind a zr_stream.
 *
 * Internal, and unlike the other internal headers shared across layers: the
 * host wrappers of the kernels (src/quant, src/optim, later src/coll) include
 * it, which is a dependency downwards (base is below them all). Only
 * <cuda_runtime_api.h>, a C header, is included, and only where CUDA is
 * built.
 *
 * Also what device.c shares with the CUDA half it calls (device_cuda.c, or
 * device_nocuda.c in a build without CUDA): the stream and event objects
 * and the table of what a CUDA device does.
 */
#ifndef ZR_DEVICE_IMPL_H
#define ZR_DEVICE_IMPL_H

#include "zr/device.h"

struct zr_stream {
    zr_device dev;
    void *cuda; /* CUDA device: its cudaStream_t */
};

struct zr_event {
    zr_device dev;
    double t; /* CPU device: when it was recorded */
    int recorded;
    void *cuda; /* CUDA device: its cudaEvent_t */
};

/*
 * What device.c's functions do on a CUDA device: zr_device_cuda_ops is
 * device_cuda.c's where CUDA is built. In a build without, it is
 * device_nocuda.c's, whose allocations and creations refuse with "built
 * without CUDA" and whose other members are NULL (no CUDA block, stream or
 * event exists there to reach them). void *: a cudaStream_t or cudaEvent_t.
 */
typedef struct zr_device_cuda_table {
    zr_status (*alloc)(const zr_device *dev, void **out, size_t bytes, const char *file, int line);
    void (*free)(const zr_device *dev, void *ptr);
    zr_status (*alloc_pinned)(void **out, size_t bytes, const char *file, int line);
    void (*free_pinned)(void *ptr);
    zr_status (*stream_create)(const zr_device *dev, void **stream);
    void (*stream_destroy)(const zr_device *dev, void *stream);
    zr_status (*stream_sync)(void *stream);
    zr_status (*event_create)(const zr_device *dev, void **event);
    void (*event_destroy)(const zr_device *dev, void *event);
    zr_status (*event_record)(void *event, void *stream);
    zr_status (*stream_wait)(void *stream, void *event);
    zr_status (*event_sync)(void *event);
    zr_status (*event_query)(void *event, int *done);
    zr_status (*event_elapsed)(void *start, void *end, float *ms);
    zr_status (*copy)(void *dst, const void *src, size_t bytes, void *stream);
    zr_status (*fill)(void *dst, int value, size_t bytes, void *stream);
} zr_device_cuda_table;

extern const zr_device_cuda_table zr_device_cuda_ops;

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
