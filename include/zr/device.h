/*
 * zr/device.h - where tensors live and kernels run: the host CPU or a CUDA
 * GPU (issue 23). Base layer: nothing here knows ranks, MPI or the model.
 *
 * A zr_device is a small value: the CPU, or a CUDA ordinal with the GPU's
 * name, memory and compute capability. Memory, streams, events, copies and
 * memsets go through it:
 *   - the CPU device is today's host code: memory from zr_alloc_at (zeroed),
 *     copies and memsets done at once, streams and events that wait for
 *     nothing (an event records the time, so elapsed times still work);
 *   - a CUDA device allocates with cudaMalloc (not zeroed), pinned host
 *     memory with cudaHostAlloc, and queues copies and memsets on streams.
 * Every allocation is counted like zr_alloc_at's: device bytes apart
 * (zr_mem_device_current), pinned bytes with the host's, so the tests' leak
 * check (tests/test.h) covers both.
 *
 * Errors: every CUDA failure becomes ZR_ERR_DEVICE with a message naming the
 * call, the place and the runtime's own words. A build without CUDA (make
 * CUDA=0, or no nvcc) fails every CUDA request at once with "built without
 * CUDA"; a machine without a usable GPU fails with "no GPU found" and the
 * runtime's reason.
 *
 * Ranks and GPUs: node-local rank r uses visible GPU r mod (visible GPUs),
 * where CUDA_VISIBLE_DEVICES decides what is visible, as in the CUDA runtime.
 * More ranks than GPUs on a node is allowed (the ranks time-slice the GPU)
 * and said once, on the node's first rank.
 */
#ifndef ZR_DEVICE_H
#define ZR_DEVICE_H

#include "zr/base.h"

typedef enum zr_device_kind {
    ZR_DEVICE_CPU = 0,
    ZR_DEVICE_CUDA = 1,
} zr_device_kind;

typedef struct zr_device {
    zr_device_kind kind;
    int ordinal;            /* the CUDA runtime's ordinal (after CUDA_VISIBLE_DEVICES); -1: CPU */
    char name[96];          /* "cpu" or the GPU's name */
    size_t total_mem;       /* device memory in bytes; 0 for the CPU */
    int cc_major, cc_minor; /* compute capability; 0.0 for the CPU */
    int sm_count;           /* multiprocessors; 0 for the CPU */
} zr_device;

/* 1 when this build has a CUDA backend (real or emulated), 0 otherwise. */
int zr_device_cuda_built(void);

/* The CPU device. */
zr_device zr_device_cpu(void);

/* 1 when a and b are the same device: the CPU, or one GPU ordinal. */
int zr_device_same(const zr_device *a, const zr_device *b);

/*
 * "cpu", "cuda" (ordinal -1: the rank's GPU, zr_device_open_for_rank) or
 * "cuda:N"; ZR_ERR_INVALID naming the bad spec otherwise.
 */
zr_status zr_device_parse(const char *spec, zr_device_kind *kind, int *ordinal);

/*
 * Number of GPUs this process can use. ZR_ERR_DEVICE "built without CUDA",
 * or "no GPU found: ..." with the runtime's reason (no driver, no device,
 * CUDA_VISIBLE_DEVICES hiding them all).
 */
zr_status zr_device_cuda_count(int *count);

/* Make GPU `ordinal` this thread's current device and describe it. */
zr_status zr_device_open_cuda(int ordinal, zr_device *dev);

/*
 * Which GPU node-local rank local_rank (of local_size on the node) uses, as a
 * plain function of CUDA_VISIBLE_DEVICES' value (visible_env, NULL when unset)
 * and the runtime's device count: the runtime numbers the visible devices
 * 0..n-1 in the order CUDA_VISIBLE_DEVICES lists them, a list ends at its
 * first invalid entry (as in CUDA), and "" hides every GPU.
 */
typedef struct zr_gpu_choice {
    int ordinal;       /* runtime ordinal to open */
    int visible;       /* GPUs visible to the node's ranks */
    int sharing;       /* node-local ranks on this GPU (itself included) */
    char physical[64]; /* the GPU as the node knows it: its CUDA_VISIBLE_DEVICES entry or ordinal */
} zr_gpu_choice;
zr_status zr_device_map_rank(int local_rank, int local_size, const char *visible_env,
                             int runtime_count, zr_gpu_choice *out);

/*
 * Open the GPU of node-local rank local_rank (zr_device_map_rank with this
 * process's CUDA_VISIBLE_DEVICES and device count). When the node has more
 * ranks than GPUs, local rank 0 logs one warning line.
 */
zr_status zr_device_open_for_rank(int local_rank, int local_size, zr_device *dev);

/*
 * Free and total memory of dev now (CUDA: cudaMemGetInfo on dev's GPU, which
 * becomes this thread's current device; the CPU: ZR_ERR_INVALID, the host's
 * memory is the OS's to tell).
 */
zr_status zr_device_mem_info(const zr_device *dev, size_t *free_bytes, size_t *total_bytes);

/* One line for logs and benchmarks: "cpu" or "cuda:0 NVIDIA H100 (sm_90, 79.1 GiB, 132 SMs)". */
void zr_device_describe(const zr_device *dev, char *buf, size_t size);

/* ---- memory --------------------------------------------------------------- */

/*
 * bytes of memory on dev (CPU: zr_alloc_at, zeroed; CUDA: cudaMalloc, not
 * initialised), aligned to at least ZR_ALIGN. Free with zr_device_free on the
 * same device. 0 bytes yields a valid pointer.
 */
zr_status zr_device_alloc_at(const zr_device *dev, void **out, size_t bytes, const char *file,
                             int line);
void zr_device_free(const zr_device *dev, void *ptr);

#define ZR_DEVICE_ALLOC(dev, ptr, count)                                                           \
    ZR_CHECK(zr_device_alloc_at((dev), (void **)&(ptr), zr_mul_size_((count), sizeof *(ptr)),      \
                                __FILE__, __LINE__))

/*
 * Host memory the device copies to and from at full speed (CUDA: page-locked,
 * cudaHostAlloc; CPU: zr_alloc_at), counted as host memory. Zeroed.
 */
zr_status zr_host_alloc_pinned_at(const zr_device *dev, void **out, size_t bytes, const char *file,
                                  int line);
void zr_host_free_pinned(const zr_device *dev, void *ptr);

/* ---- streams and events ----------------------------------------------------- */

/* A queue of work on one device; work on one stream runs in order. */
typedef struct zr_stream zr_stream;
/* A point in a stream's work that others can wait for or time. */
typedef struct zr_event zr_event;

zr_status zr_stream_create(const zr_device *dev, zr_stream **out);
void zr_stream_destroy(zr_stream *s);
/* Wait until everything queued on s has run. */
zr_status zr_stream_sync(zr_stream *s);
const zr_device *zr_stream_device(const zr_stream *s);

zr_status zr_event_create(const zr_device *dev, zr_event **out);
void zr_event_destroy(zr_event *e);
/* Mark the current end of s's queue. */
zr_status zr_event_record(zr_event *e, zr_stream *s);
/* Work queued on s after this call starts after e's point has been reached. */
zr_status zr_stream_wait_event(zr_stream *s, zr_event *e);
zr_status zr_event_sync(zr_event *e);
/* *done = 1 when e's point has been reached. */
zr_status zr_event_query(zr_event *e, int *done);
/* Milliseconds between two recorded, reached events. */
zr_status zr_event_elapsed_ms(zr_event *start, zr_event *end, float *ms);

/* ---- copies and memsets --------------------------------------------------------- */

/*
 * Queue a copy of bytes from src to dst on s, in whatever direction the two
 * pointers imply (host, pinned host, device). On the CPU device it is done
 * before the call returns. The memory must stay valid, and src unchanged,
 * until the copy has run (zr_stream_sync or an event).
 */
zr_status zr_memcpy_async(void *dst, const void *src, size_t bytes, zr_stream *s);
/* Queue setting bytes of dst to the byte value on s (CPU: at once). */
zr_status zr_memset_async(void *dst, int value, size_t bytes, zr_stream *s);

#endif /* ZR_DEVICE_H */
