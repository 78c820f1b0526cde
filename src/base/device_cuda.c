/*
 * device_cuda.c - CUDA devices through the runtime API: opening one, its
 * memory, and the CUDA half of device.c's streams, events and copies
 * (zr_device_cuda_ops). Compiled only where CUDA is built; a build without
 * compiles device_nocuda.c instead.
 *
 * The CUDA runtime does not say how large a block is when it is freed, so
 * every device and pinned block is kept in a small table (pointer, size,
 * allocation site) until it is freed; allocations of device memory are few
 * and large (buffers, not elements), so a linear table is enough. The table
 * itself comes from zr_alloc_at and is released when it empties, so a
 * program that frees everything ends with zr_mem_current() == 0.
 */
#define _POSIX_C_SOURCE 200809L

#include "device_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int zr_device_cuda_built(void)
{
    return 1;
}

zr_status zr_cuda_fail(cudaError_t err, const char *call, const char *file, int line)
{
    const char *f = strstr(file, "src/");
    (void)cudaGetLastError(); /* a non-sticky error must not resurface at the next call */
    return zr_error_at(ZR_ERR_DEVICE, file, line, "%s failed at %s:%d: %s (%s)", call,
                       f ? f + 4 : file, line, cudaGetErrorString(err), cudaGetErrorName(err));
}

cudaStream_t zr_stream_cuda(const zr_stream *s)
{
    ZR_ASSERT(s != NULL && s->dev.kind == ZR_DEVICE_CUDA);
    return (cudaStream_t)s->cuda;
}

zr_status zr_device_cuda_count(int *count)
{
    *count = 0;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        ZR_FAIL(ZR_ERR_DEVICE, "no GPU found: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err),
                cudaGetErrorName(err));
    }
    if (n <= 0) {
        const char *env = getenv("CUDA_VISIBLE_DEVICES");
        ZR_FAIL(ZR_ERR_DEVICE, "no GPU found: the CUDA runtime sees no device%s%s%s",
                env ? " (CUDA_VISIBLE_DEVICES='" : "", env ? env : "", env ? "')" : "");
    }
    *count = n;
    return ZR_OK;
}

zr_status zr_device_open_cuda(int ordinal, zr_device *dev)
{
    int n;
    ZR_CHECK(zr_device_cuda_count(&n));
    if (ordinal < 0 || ordinal >= n) {
        ZR_FAIL(ZR_ERR_DEVICE, "no GPU cuda:%d: this process sees %d GPU%s (cuda:0..%d)", ordinal,
                n, n == 1 ? "" : "s", n - 1);
    }
    ZR_CUDA_CHECK(cudaSetDevice(ordinal));
    struct cudaDeviceProp prop;
    ZR_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    memset(dev, 0, sizeof *dev);
    dev->kind = ZR_DEVICE_CUDA;
    dev->ordinal = ordinal;
    size_t len = strnlen(prop.name, sizeof prop.name);
    len = len < sizeof dev->name - 1 ? len : sizeof dev->name - 1;
    memcpy(dev->name, prop.name, len); /* dev was zeroed: the name stays terminated */
    dev->total_mem = prop.totalGlobalMem;
    dev->cc_major = prop.major;
    dev->cc_minor = prop.minor;
    dev->sm_count = prop.multiProcessorCount;
    return ZR_OK;
}

zr_status zr_device_open_for_rank(int local_rank, int local_size, zr_device *dev)
{
    int n;
    ZR_CHECK(zr_device_cuda_count(&n));
    zr_gpu_choice c;
    ZR_CHECK(zr_device_map_rank(local_rank, local_size, getenv("CUDA_VISIBLE_DEVICES"), n, &c));
    if (local_rank == 0 && local_size > c.visible) {
        ZR_WARN("%d ranks on this node share %d GPU%s (up to %d per GPU): they take turns on it",
                local_size, c.visible, c.visible == 1 ? "" : "s", c.sharing);
    }
    return zr_device_open_cuda(c.ordinal, dev);
}

zr_status zr_device_mem_info(const zr_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    if (dev->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "memory info: %s is not a GPU", dev->name);
    }
    ZR_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    ZR_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return ZR_OK;
}

/* ---- memory ----------------------------------------------------------------------- */
/* A device or pinned block from the CUDA runtime, kept until it is freed. */
typedef struct cuda_block {
    void *ptr;
    size_t bytes;
    const char *file;
    int line;
    int pinned;
} cuda_block;

static cuda_block *blocks;
static size_t nblocks, cap_blocks;

static zr_status block_add(void *ptr, size_t bytes, const char *file, int line, int pinned)
{
    if (nblocks == cap_blocks) {
        size_t cap = cap_blocks ? 2 * cap_blocks : 64;
        cuda_block *grown;
        ZR_ALLOC(grown, cap);
        if (nblocks > 0) {
            memcpy(grown, blocks, nblocks * sizeof *grown);
        }
        zr_free(blocks);
        blocks = grown;
        cap_blocks = cap;
    }
    blocks[nblocks++] = (cuda_block){ptr, bytes, file, line, pinned};
    zr_mem_count_at(pinned ? ZR_MEM_HOST : ZR_MEM_DEVICE, bytes, 1, file, line);
    return ZR_OK;
}

/* Forget ptr's block (which must be there); empties release the table. */
static void block_remove(void *ptr, int pinned)
{
    size_t i = nblocks;
    while (i > 0 && blocks[i - 1].ptr != ptr) {
        i--;
    }
    ZR_ASSERT(i > 0 && blocks[i - 1].pinned == pinned); /* freed twice, or not zr's */
    cuda_block b = blocks[i - 1];
    blocks[i - 1] = blocks[--nblocks];
    zr_mem_count_at(pinned ? ZR_MEM_HOST : ZR_MEM_DEVICE, b.bytes, 0, b.file, b.line);
    if (nblocks == 0) {
        zr_free(blocks);
        blocks = NULL;
        cap_blocks = 0;
    }
}

static zr_status cuda_alloc(const zr_device *dev, void **out, size_t bytes, const char *file,
                            int line)
{
    if (bytes > SIZE_MAX / 2) {
        return zr_error_at(ZR_ERR_NOMEM, file, line, "device allocation of an impossible size");
    }
    size_t rounded = zr_round_up(bytes == 0 ? 1 : bytes, ZR_ALIGN);
    ZR_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, rounded);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return zr_error_at(ZR_ERR_NOMEM, file, line,
                           "out of device memory: %zu bytes on cuda:%d at %s:%d: %s (%s)", bytes,
                           dev->ordinal, file, line, cudaGetErrorString(err),
                           cudaGetErrorName(err));
    }
    zr_status st = block_add(p, rounded, file, line, 0);
    if (st != ZR_OK) {
        cudaFree(p);
        return st;
    }
    *out = p;
    return ZR_OK;
}

static void cuda_free(const zr_device *dev, void *ptr)
{
    block_remove(ptr, 0);
    cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        ZR_WARN("cudaFree on cuda:%d: %s (%s)", dev->ordinal, cudaGetErrorString(err),
                cudaGetErrorName(err));
    }
}

static zr_status cuda_alloc_pinned(void **out, size_t bytes, const char *file, int line)
{
    if (bytes > SIZE_MAX / 2) {
        return zr_error_at(ZR_ERR_NOMEM, file, line, "pinned allocation of an impossible size");
    }
    size_t rounded = zr_round_up(bytes == 0 ? 1 : bytes, ZR_ALIGN);
    void *p = NULL;
    cudaError_t err = cudaHostAlloc(&p, rounded, cudaHostAllocPortable);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return zr_error_at(ZR_ERR_NOMEM, file, line,
                           "out of pinned host memory: %zu bytes at %s:%d: %s (%s)", bytes, file,
                           line, cudaGetErrorString(err), cudaGetErrorName(err));
    }
    memset(p, 0, rounded);
    zr_status st = block_add(p, rounded, file, line, 1);
    if (st != ZR_OK) {
        cudaFreeHost(p);
        return st;
    }
    *out = p;
    return ZR_OK;
}

static void cuda_free_pinned(void *ptr)
{
    block_remove(ptr, 1);
    cudaError_t err = cudaFreeHost(ptr);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        ZR_WARN("cudaFreeHost: %s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
    }
}

/* ---- streams, events, copies ------------------------------------------------------- */

static zr_status cuda_stream_create(const zr_device *dev, void **stream)
{
    cudaStream_t s = NULL;
    ZR_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    ZR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return ZR_OK;
}

static void cuda_stream_destroy(const zr_device *dev, void *stream)
{
    if (cudaStreamDestroy((cudaStream_t)stream) != cudaSuccess) {
        (void)cudaGetLastError();
        ZR_WARN("cudaStreamDestroy failed on cuda:%d", dev->ordinal);
    }
}

static zr_status cuda_stream_sync(void *stream)
{
    ZR_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
    return ZR_OK;
}

static zr_status cuda_event_create(const zr_device *dev, void **event)
{
    cudaEvent_t e = NULL;
    ZR_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    ZR_CUDA_CHECK(cudaEventCreate(&e));
    *event = e;
    return ZR_OK;
}

static void cuda_event_destroy(const zr_device *dev, void *event)
{
    if (cudaEventDestroy((cudaEvent_t)event) != cudaSuccess) {
        (void)cudaGetLastError();
        ZR_WARN("cudaEventDestroy failed on cuda:%d", dev->ordinal);
    }
}

static zr_status cuda_event_record(void *event, void *stream)
{
    ZR_CUDA_CHECK(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
    return ZR_OK;
}

static zr_status cuda_stream_wait(void *stream, void *event)
{
    ZR_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
    return ZR_OK;
}

static zr_status cuda_event_sync(void *event)
{
    ZR_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)event));
    return ZR_OK;
}

static zr_status cuda_event_query(void *event, int *done)
{
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = 0;
        return ZR_OK;
    }
    ZR_CUDA_CHECK(err);
    return ZR_OK;
}

static zr_status cuda_event_elapsed(void *start, void *end, float *ms)
{
    ZR_CUDA_CHECK(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
    return ZR_OK;
}

static zr_status cuda_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    ZR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
    return ZR_OK;
}

static zr_status cuda_fill(void *dst, int value, size_t bytes, void *stream)
{
    ZR_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)stream));
    return ZR_OK;
}

const zr_device_cuda_table zr_device_cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .alloc_pinned = cuda_alloc_pinned,
    .free_pinned = cuda_free_pinned,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait = cuda_stream_wait,
    .event_sync = cuda_event_sync,
    .event_query = cuda_event_query,
    .event_elapsed = cuda_event_elapsed,
    .copy = cuda_copy,
    .fill = cuda_fill,
};
