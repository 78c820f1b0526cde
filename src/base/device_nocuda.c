/*
 * device_nocuda.c - CUDA devices in a build without CUDA: the Makefile
 * compiles it instead of device_cuda.c. Every CUDA request fails at once
 * with "built without CUDA"; no CUDA block, stream or event can exist, so
 * the table's other members are never reached.
 */
#include "device_impl.h"

#include <string.h>

#define NO_CUDA_MSG "built without CUDA (make CUDA=0, or no nvcc when zr was built)"

int zr_device_cuda_built(void)
{
    return 0;
}

zr_status zr_device_mem_info(const zr_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    ZR_FAIL(ZR_ERR_DEVICE, "%s: zr was " NO_CUDA_MSG, dev->name);
}

zr_status zr_device_cuda_count(int *count)
{
    *count = 0;
    ZR_FAIL(ZR_ERR_DEVICE, "no GPU: zr was " NO_CUDA_MSG);
}

zr_status zr_device_open_cuda(int ordinal, zr_device *dev)
{
    memset(dev, 0, sizeof *dev);
    ZR_FAIL(ZR_ERR_DEVICE, "cuda:%d: zr was " NO_CUDA_MSG, ordinal);
}

zr_status zr_device_open_for_rank(int local_rank, int local_size, zr_device *dev)
{
    memset(dev, 0, sizeof *dev);
    ZR_FAIL(ZR_ERR_DEVICE, "no GPU for local rank %d of %d: zr was " NO_CUDA_MSG, local_rank,
            local_size);
}

static zr_status no_alloc(const zr_device *dev, void **out, size_t bytes, const char *file,
                          int line)
{
    return zr_error_at(ZR_ERR_DEVICE, file, line, "device memory: zr was " NO_CUDA_MSG);
}

static zr_status no_alloc_pinned(void **out, size_t bytes, const char *file, int line)
{
    return zr_error_at(ZR_ERR_DEVICE, file, line, "pinned memory: zr was " NO_CUDA_MSG);
}

static zr_status no_stream(const zr_device *dev, void **stream)
{
    ZR_FAIL(ZR_ERR_DEVICE, "stream: zr was " NO_CUDA_MSG);
}

static zr_status no_event(const zr_device *dev, void **event)
{
    ZR_FAIL(ZR_ERR_DEVICE, "event: zr was " NO_CUDA_MSG);
}

const zr_device_cuda_table zr_device_cuda_ops = {
    .alloc = no_alloc,
    .alloc_pinned = no_alloc_pinned,
    .stream_create = no_stream,
    .event_create = no_event,
};
