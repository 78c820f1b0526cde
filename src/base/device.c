/*
 * device.c - the device layer of zr/device.h: the CPU device (today's host
 * code), CUDA devices through the runtime API, the choice of a rank's GPU,
 * and the accounting of device and pinned memory.
 *
 * The CUDA runtime does not say how large a block is when it is freed, so
 * every device and pinned block is kept in a small table (pointer, size,
 * allocation site) until it is freed; allocations of device memory are few
 * and large (buffers, not elements), so a linear table is enough. The table
 * itself comes from zr_alloc_at and is released when it empties, so a
 * program that frees everything ends with zr_mem_current() == 0.
 *
 * Without CUDA in the build every CUDA request fails at once with "built
 * without CUDA"; the CPU device and the rank-to-GPU mapping work regardless.
 */
#define _POSIX_C_SOURCE 200809L

#include "device_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_CUDA_MSG "built without CUDA (make CUDA=0, or no nvcc when zr was built)"

struct zr_stream {
    zr_device dev;
#if ZR_CUDA
    cudaStream_t cuda;
#endif
};

struct zr_event {
    zr_device dev;
    double t; /* CPU device: when it was recorded */
    int recorded;
#if ZR_CUDA
    cudaEvent_t cuda;
#endif
};

int zr_device_cuda_built(void)
{
#if ZR_CUDA
    return 1;
#else
    return 0;
#endif
}

zr_device zr_device_cpu(void)
{
    zr_device d;
    memset(&d, 0, sizeof d);
    d.kind = ZR_DEVICE_CPU;
    d.ordinal = -1;
    snprintf(d.name, sizeof d.name, "cpu");
    return d;
}

zr_status zr_device_parse(const char *spec, zr_device_kind *kind, int *ordinal)
{
    if (spec != NULL && strcmp(spec, "cpu") == 0) {
        *kind = ZR_DEVICE_CPU;
        *ordinal = -1;
        return ZR_OK;
    }
    if (spec != NULL && strcmp(spec, "cuda") == 0) {
        *kind = ZR_DEVICE_CUDA;
        *ordinal = -1;
        return ZR_OK;
    }
    if (spec != NULL && strncmp(spec, "cuda:", 5) == 0 && isdigit((unsigned char)spec[5])) {
        char *end;
        long v = strtol(spec + 5, &end, 10);
        if (*end == '\0' && v <= 1024) {
            *kind = ZR_DEVICE_CUDA;
            *ordinal = (int)v;
            return ZR_OK;
        }
    }
    ZR_FAIL(ZR_ERR_INVALID, "device '%s': expected cpu, cuda or cuda:N", spec ? spec : "(null)");
}

/* ---- the rank's GPU ----------------------------------------------------------- */

/*
 * The leading valid entries of a CUDA_VISIBLE_DEVICES value: an index
 * (digits) or a GPU/MIG UUID; CUDA ignores everything from the first invalid
 * entry on. Copies entry `want` (if >= 0) into out.
 */
static int visible_entries(const char *env, int want, char *out, size_t size)
{
    int n = 0;
    const char *p = env;
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && isspace((unsigned char)*p)) {
            p++, len--;
        }
        while (len > 0 && isspace((unsigned char)p[len - 1])) {
            len--;
        }
        int ok = len > 0;
        if (ok && (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0)) {
            ok = len > 4;
        } else {
            for (size_t i = 0; i < len && ok; i++) {
                ok = isdigit((unsigned char)p[i]) != 0;
            }
        }
        if (!ok) {
            break;
        }
        if (n == want) {
            snprintf(out, size, "%.*s", (int)len, p);
        }
        n++;
        if (end == NULL) {
            break;
        }
        p = end + 1;
    }
    return n;
}

zr_status zr_device_map_rank(int local_rank, int local_size, const char *visible_env,
                             int runtime_count, zr_gpu_choice *out)
{
    memset(out, 0, sizeof *out);
    if (local_size < 1 || local_rank < 0 || local_rank >= local_size) {
        ZR_FAIL(ZR_ERR_INVALID, "GPU choice: local rank %d of %d ranks on the node", local_rank,
                local_size);
    }
    int visible = runtime_count;
    if (visible_env != NULL) {
        int listed = visible_entries(visible_env, -1, NULL, 0);
        visible = listed < runtime_count ? listed : runtime_count;
    }
    if (visible <= 0) {
        ZR_FAIL(ZR_ERR_DEVICE, "no GPU found: %d device%s, CUDA_VISIBLE_DEVICES %s%s%s",
                runtime_count, runtime_count == 1 ? "" : "s", visible_env ? "'" : "unset",
                visible_env ? visible_env : "", visible_env ? "'" : "");
    }
    out->visible = visible;
    out->ordinal = local_rank % visible;
    /* ranks o, o + visible, o + 2 visible, ... share ordinal o */
    out->sharing = (local_size - out->ordinal + visible - 1) / visible;
    if (visible_env != NULL) {
        visible_entries(visible_env, out->ordinal, out->physical, sizeof out->physical);
    } else {
        snprintf(out->physical, sizeof out->physical, "%d", out->ordinal);
    }
    return ZR_OK;
}

void zr_device_describe(const zr_device *dev, char *buf, size_t size)
{
    if (dev->kind == ZR_DEVICE_CPU) {
        snprintf(buf, size, "cpu");
        return;
    }
    snprintf(buf, size, "cuda:%d %s (sm_%d%d, %.1f GiB, %d SMs)", dev->ordinal, dev->name,
             dev->cc_major, dev->cc_minor, (double)dev->total_mem / (1024.0 * 1024 * 1024),
             dev->sm_count);
}

/* ---- CUDA devices ------------------------------------------------------------------- */

#if ZR_CUDA

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
    return s->cuda;
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

#else /* !ZR_CUDA */

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

#endif /* ZR_CUDA */

/* ---- memory ----------------------------------------------------------------------- */

#if ZR_CUDA
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
#endif

zr_status zr_device_alloc_at(const zr_device *dev, void **out, size_t bytes, const char *file,
                             int line)
{
    *out = NULL;
    if (dev->kind == ZR_DEVICE_CPU) {
        return zr_alloc_at(out, bytes, file, line);
    }
#if ZR_CUDA
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
#else
    return zr_error_at(ZR_ERR_DEVICE, file, line, "device memory: zr was " NO_CUDA_MSG);
#endif
}

void zr_device_free(const zr_device *dev, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    if (dev->kind == ZR_DEVICE_CPU) {
        zr_free(ptr);
        return;
    }
#if ZR_CUDA
    block_remove(ptr, 0);
    cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        ZR_WARN("cudaFree on cuda:%d: %s (%s)", dev->ordinal, cudaGetErrorString(err),
                cudaGetErrorName(err));
    }
#else
    ZR_ASSERT(!"a CUDA block in a build without CUDA");
#endif
}

zr_status zr_host_alloc_pinned_at(const zr_device *dev, void **out, size_t bytes, const char *file,
                                  int line)
{
    *out = NULL;
    if (dev->kind == ZR_DEVICE_CPU) {
        return zr_alloc_at(out, bytes, file, line);
    }
#if ZR_CUDA
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
#else
    return zr_error_at(ZR_ERR_DEVICE, file, line, "pinned memory: zr was " NO_CUDA_MSG);
#endif
}

void zr_host_free_pinned(const zr_device *dev, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    if (dev->kind == ZR_DEVICE_CPU) {
        zr_free(ptr);
        return;
    }
#if ZR_CUDA
    block_remove(ptr, 1);
    cudaError_t err = cudaFreeHost(ptr);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        ZR_WARN("cudaFreeHost: %s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
    }
#else
    ZR_ASSERT(!"a pinned block in a build without CUDA");
#endif
}

/* ---- streams, events, copies ------------------------------------------------------- */

zr_status zr_stream_create(const zr_device *dev, zr_stream **out)
{
    *out = NULL;
    zr_stream *s;
    ZR_ALLOC(s, 1);
    s->dev = *dev;
    if (dev->kind == ZR_DEVICE_CUDA) {
#if ZR_CUDA
        zr_status st = ZR_OK;
        ZR_CUDA_CHECK_GOTO(cudaSetDevice(dev->ordinal), st, fail);
        ZR_CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&s->cuda, cudaStreamNonBlocking), st, fail);
        *out = s;
        return ZR_OK;
    fail:
        zr_free(s);
        return st;
#else
        zr_free(s);
        ZR_FAIL(ZR_ERR_DEVICE, "stream: zr was " NO_CUDA_MSG);
#endif
    }
    *out = s;
    return ZR_OK;
}

void zr_stream_destroy(zr_stream *s)
{
    if (s == NULL) {
        return;
    }
#if ZR_CUDA
    if (s->dev.kind == ZR_DEVICE_CUDA && cudaStreamDestroy(s->cuda) != cudaSuccess) {
        (void)cudaGetLastError();
        ZR_WARN("cudaStreamDestroy failed on cuda:%d", s->dev.ordinal);
    }
#endif
    zr_free(s);
}

const zr_device *zr_stream_device(const zr_stream *s)
{
    return &s->dev;
}

zr_status zr_stream_sync(zr_stream *s)
{
#if ZR_CUDA
    if (s->dev.kind == ZR_DEVICE_CUDA) {
        ZR_CUDA_CHECK(cudaStreamSynchronize(s->cuda));
    }
#endif
    return ZR_OK;
}

zr_status zr_event_create(const zr_device *dev, zr_event **out)
{
    *out = NULL;
    zr_event *e;
    ZR_ALLOC(e, 1);
    e->dev = *dev;
    if (dev->kind == ZR_DEVICE_CUDA) {
#if ZR_CUDA
        zr_status st = ZR_OK;
        ZR_CUDA_CHECK_GOTO(cudaSetDevice(dev->ordinal), st, fail);
        ZR_CUDA_CHECK_GOTO(cudaEventCreate(&e->cuda), st, fail);
        *out = e;
        return ZR_OK;
    fail:
        zr_free(e);
        return st;
#else
        zr_free(e);
        ZR_FAIL(ZR_ERR_DEVICE, "event: zr was " NO_CUDA_MSG);
#endif
    }
    *out = e;
    return ZR_OK;
}

void zr_event_destroy(zr_event *e)
{
    if (e == NULL) {
        return;
    }
#if ZR_CUDA
    if (e->dev.kind == ZR_DEVICE_CUDA && cudaEventDestroy(e->cuda) != cudaSuccess) {
        (void)cudaGetLastError();
        ZR_WARN("cudaEventDestroy failed on cuda:%d", e->dev.ordinal);
    }
#endif
    zr_free(e);
}

static zr_status same_device(const zr_event *e, const zr_stream *s, const char *what)
{
    if (e->dev.kind != s->dev.kind || e->dev.ordinal != s->dev.ordinal) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: the event belongs to %s %d, the stream to %s %d", what,
                e->dev.kind == ZR_DEVICE_CPU ? "cpu" : "cuda", e->dev.ordinal,
                s->dev.kind == ZR_DEVICE_CPU ? "cpu" : "cuda", s->dev.ordinal);
    }
    return ZR_OK;
}

zr_status zr_event_record(zr_event *e, zr_stream *s)
{
    ZR_CHECK(same_device(e, s, "event record"));
    e->recorded = 1;
#if ZR_CUDA
    if (e->dev.kind == ZR_DEVICE_CUDA) {
        ZR_CUDA_CHECK(cudaEventRecord(e->cuda, s->cuda));
        return ZR_OK;
    }
#endif
    e->t = zr_now();
    return ZR_OK;
}

zr_status zr_stream_wait_event(zr_stream *s, zr_event *e)
{
    ZR_CHECK(same_device(e, s, "stream wait"));
#if ZR_CUDA
    if (s->dev.kind == ZR_DEVICE_CUDA) {
        ZR_CUDA_CHECK(cudaStreamWaitEvent(s->cuda, e->cuda, 0));
    }
#endif
    return ZR_OK;
}

zr_status zr_event_sync(zr_event *e)
{
#if ZR_CUDA
    if (e->dev.kind == ZR_DEVICE_CUDA) {
        ZR_CUDA_CHECK(cudaEventSynchronize(e->cuda));
    }
#endif
    return ZR_OK;
}

zr_status zr_event_query(zr_event *e, int *done)
{
    *done = 1;
#if ZR_CUDA
    if (e->dev.kind == ZR_DEVICE_CUDA) {
        cudaError_t err = cudaEventQuery(e->cuda);
        if (err == cudaErrorNotReady) {
            (void)cudaGetLastError();
            *done = 0;
            return ZR_OK;
        }
        ZR_CUDA_CHECK(err);
    }
#endif
    return ZR_OK;
}

zr_status zr_event_elapsed_ms(zr_event *start, zr_event *end, float *ms)
{
    *ms = 0.0f;
    if (!start->recorded || !end->recorded) {
        ZR_FAIL(ZR_ERR_INVALID, "event elapsed time: an event was never recorded");
    }
#if ZR_CUDA
    if (start->dev.kind == ZR_DEVICE_CUDA) {
        ZR_CUDA_CHECK(cudaEventElapsedTime(ms, start->cuda, end->cuda));
        return ZR_OK;
    }
#endif
    *ms = (float)((end->t - start->t) * 1e3);
    return ZR_OK;
}

zr_status zr_memcpy_async(void *dst, const void *src, size_t bytes, zr_stream *s)
{
    if (bytes == 0) {
        return ZR_OK;
    }
#if ZR_CUDA
    if (s->dev.kind == ZR_DEVICE_CUDA) {
        ZR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->cuda));
        return ZR_OK;
    }
#endif
    memcpy(dst, src, bytes);
    return ZR_OK;
}

zr_status zr_memset_async(void *dst, int value, size_t bytes, zr_stream *s)
{
    if (bytes == 0) {
        return ZR_OK;
    }
#if ZR_CUDA
    if (s->dev.kind == ZR_DEVICE_CUDA) {
        ZR_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, s->cuda));
        return ZR_OK;
    }
#endif
    memset(dst, value, bytes);
    return ZR_OK;
}
