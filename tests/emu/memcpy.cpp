/*
 * memcpy.cpp - the GPU emulator's memory, copies and memsets (tests/emu, issue 23).
 *
 * Device memory is filled with 0xFF bytes at cudaMalloc (a float NaN), so a
 * kernel or a copy that reads memory nobody wrote shows it. Each end of a copy
 * or memset must lie inside one allocation and match the cudaMemcpyKind; both
 * ends become accesses for the race detector (race.cpp). Copies and memsets
 * wait for the host exactly where CUDA's "API synchronization behavior" says
 * they do, and nowhere else, so a program that relies on an implicit wait CUDA
 * does not make is caught: cudaMemcpy waits except device to device and
 * pageable host to device (staged: the source is copied at the call), the
 * async copy waits only for a pageable destination or between two host
 * buffers, cudaMemset only on pinned
 * memory, and cudaFree / cudaFreeHost synchronise the device.
 */
#include "emu.h"

using namespace zr_emu;

/* ---- memory ----------------------------------------------------------------------- */

static size_t g_dev_bytes[16]; /* under api_mutex */

extern "C" {

cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    ZR_EMU_ENTER("cudaMemGetInfo");
    if (free == nullptr || total == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    *total = cfg().mem_bytes;
    *free = cfg().mem_bytes - g_dev_bytes[current_device()];
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    ZR_EMU_ENTER("cudaMalloc");
    if (devPtr == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    *devPtr = nullptr;
    if (size == 0) {
        return cudaSuccess;
    }
    int dev = current_device();
    size_t rounded = (size + 255) & ~(size_t)255;
    std::lock_guard<std::mutex> lock(api_mutex());
    if (rounded < size || rounded > cfg().mem_bytes - g_dev_bytes[dev]) {
        return set_last_error(cudaErrorMemoryAllocation);
    }
    void *p = region_alloc(size);
    if (p == nullptr) {
        return set_last_error(cudaErrorMemoryAllocation);
    }
    memset(p, 0xff, rounded); /* poison: unwritten floats read as NaN */
    g_dev_bytes[dev] += rounded;
    alloc_add(p, size, MEM_DEVICE, dev);
    *devPtr = p;
    return cudaSuccess;
}

/* cudaFree and cudaFreeHost synchronise the device, as CUDA's do. */
static cudaError_t free_common(void *p, mem_kind kind, const char *call)
{
    cudaError_t e = api_enter(call, false);
    if (e != cudaSuccess) {
        return set_last_error(e);
    }
    if (p == nullptr) {
        return sticky_error();
    }
    sync_device(-1);
    std::lock_guard<std::mutex> lock(api_mutex());
    size_t size = 0;
    alloc_view v = alloc_find(p);
    if (!alloc_remove(p, kind, &size)) {
        std::string freed = alloc_freed_note(p);
        if (!freed.empty()) {
            emu_error("%s(%p): %s, freed twice", call, p, freed.c_str());
        } else if (v.kind != MEM_PAGEABLE) {
            emu_error("%s(%p): not the start of a %s allocation (allocation #%llu of %zu bytes "
                      "at %#lx is %s memory)",
                      call, p, kind == MEM_DEVICE ? "cudaMalloc" : "cudaMallocHost",
                      (unsigned long long)v.serial, v.size, (unsigned long)v.base,
                      v.kind == MEM_DEVICE ? "device" : "pinned host");
        } else {
            emu_error("%s(%p): not memory from %s", call, p,
                      kind == MEM_DEVICE ? "cudaMalloc" : "cudaMallocHost/cudaHostAlloc");
        }
        return set_last_error(cudaErrorInvalidValue);
    }
    if (kind == MEM_DEVICE) {
        g_dev_bytes[v.device] -= (size + 255) & ~(size_t)255;
    }
    region_free(p, size);
    return set_last_error(sticky_error());
}

cudaError_t cudaFree(void *devPtr)
{
    return free_common(devPtr, MEM_DEVICE, "cudaFree");
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    ZR_EMU_ENTER("cudaHostAlloc");
    if (pHost == nullptr || (flags & ~0x7u) != 0) {
        return set_last_error(cudaErrorInvalidValue);
    }
    *pHost = nullptr;
    if (size == 0) {
        return cudaSuccess;
    }
    size_t rounded = (size + 255) & ~(size_t)255;
    if (rounded < size) {
        return set_last_error(cudaErrorMemoryAllocation);
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    void *p = region_alloc(size);
    if (p == nullptr) {
        return set_last_error(cudaErrorMemoryAllocation);
    }
    memset(p, 0xff, rounded);
    alloc_add(p, size, MEM_PINNED, current_device());
    *pHost = p;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void *ptr)
{
    return free_common(ptr, MEM_PINNED, "cudaFreeHost");
}

} /* extern "C" */

/* ---- copies and memsets --------------------------------------------------------- */

namespace {

struct copy_op : op {
    void *dst;
    const void *src;
    size_t n;
    std::unique_ptr<char[]> staged; /* pageable source, copied at the call */
    void run() override
    {
        if (sticky_error() == cudaSuccess) {
            memcpy(dst, staged ? staged.get() : src, n);
        }
    }
};

struct memset_op : op {
    void *dst;
    int value;
    size_t n;
    void run() override
    {
        if (sticky_error() == cudaSuccess) {
            memset(dst, value, n);
        }
    }
};

const char *kind_word(mem_kind k)
{
    return k == MEM_DEVICE ? "device" : k == MEM_PINNED ? "pinned host" : "pageable host";
}

/* One end of a copy or memset: where it is, and whether [p, p+n) stays in
 * its allocation. Under api_mutex. */
bool check_side(const void *p, size_t n, const char *call, const char *side, alloc_view *out)
{
    *out = alloc_find(p);
    if (out->kind == MEM_PAGEABLE) {
        std::string freed = alloc_freed_note(p);
        if (!freed.empty()) {
            emu_error("%s: the %s %p is %s", call, side, p, freed.c_str());
            return false;
        }
        return true;
    }
    uintptr_t a = (uintptr_t)p;
    if (n > out->base + out->size - a) {
        emu_error("%s: the %s range [%p, +%zu) runs %zu bytes past the end of its %s "
                  "allocation (#%llu, %zu bytes at %#lx)",
                  call, side, p, n, (size_t)(a + n - (out->base + out->size)), kind_word(out->kind),
                  (unsigned long long)out->serial, out->size, (unsigned long)out->base);
        return false;
    }
    return true;
}

bool is_host(mem_kind k)
{
    return k != MEM_DEVICE;
}

/* Validates a copy against its kind; under api_mutex. */
cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *call,
                       alloc_view *d, alloc_view *s)
{
    if ((unsigned)kind > (unsigned)cudaMemcpyDefault) {
        return cudaErrorInvalidMemcpyDirection;
    }
    if (dst == nullptr || src == nullptr) {
        return cudaErrorInvalidValue;
    }
    if (!check_side(dst, n, call, "destination", d) || !check_side(src, n, call, "source", s)) {
        return cudaErrorInvalidValue;
    }
    bool ok = true;
    switch (kind) {
    case cudaMemcpyHostToHost:
        ok = is_host(d->kind) && is_host(s->kind);
        break;
    case cudaMemcpyHostToDevice:
        ok = d->kind == MEM_DEVICE && is_host(s->kind);
        break;
    case cudaMemcpyDeviceToHost:
        ok = is_host(d->kind) && s->kind == MEM_DEVICE;
        break;
    case cudaMemcpyDeviceToDevice:
        ok = d->kind == MEM_DEVICE && s->kind == MEM_DEVICE;
        break;
    case cudaMemcpyDefault:
        break;
    }
    static const char *kinds[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice",
                                  "cudaMemcpyDeviceToHost", "cudaMemcpyDeviceToDevice",
                                  "cudaMemcpyDefault"};
    if (!ok) {
        emu_error("%s with %s: the destination %p is %s memory and the source %p is %s memory",
                  call, kinds[kind], dst, kind_word(d->kind), src, kind_word(s->kind));
        return cudaErrorInvalidValue;
    }
    uintptr_t a = (uintptr_t)dst, b = (uintptr_t)src;
    if (a < b + n && b < a + n) {
        emu_error("%s(%p, %p, %zu): the ranges overlap (undefined in CUDA)", call, dst, src, n);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

/* Queues a copy. host_wait: the call returns only when the copy is done
 * (CUDA's synchronous cases); the host then knows all that preceded it. */
cudaError_t do_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t stream,
                    bool sync_call, const char *call)
{
    std::unique_lock<std::mutex> lock(api_mutex());
    zr_emu_stream *s = resolve_stream(sync_call ? nullptr : stream);
    if (s == nullptr) {
        return cudaErrorInvalidResourceHandle;
    }
    if (n == 0) {
        return cudaSuccess;
    }
    alloc_view d, sv;
    cudaError_t e = check_copy(dst, src, n, kind, call, &d, &sv);
    if (e != cudaSuccess) {
        return e;
    }
    auto *o = new copy_op;
    o->dst = dst;
    o->src = src;
    o->n = n;
    bool staged = sv.kind == MEM_PAGEABLE && d.kind == MEM_DEVICE;
    bool host_wait;
    if (staged) {
        /* pageable -> device: CUDA copies the source to a staging buffer
         * and returns; the transfer to the device may still be running */
        o->staged.reset(new char[n]);
        memcpy(o->staged.get(), src, n);
        host_wait = false;
    } else if (sync_call) {
        host_wait = !(d.kind == MEM_DEVICE && sv.kind == MEM_DEVICE);
    } else {
        /* to pageable memory, and host to host, CUDA copies synchronously */
        host_wait = d.kind == MEM_PAGEABLE || (d.kind != MEM_DEVICE && sv.kind != MEM_DEVICE);
    }
    std::vector<mem_access> acc;
    if (sv.kind != MEM_PAGEABLE) {
        acc.push_back(mem_access{src, n, false, "source"});
    }
    if (d.kind != MEM_PAGEABLE) {
        acc.push_back(mem_access{dst, n, true, "destination"});
    }
    vclock c;
    uint64_t seq = s->enqueued + 1;
    e = enqueue(s, o, call, acc, &c);
    if (e != cudaSuccess || !host_wait) {
        return e;
    }
    lock.unlock();
    wait_completed(s, seq);
    lock.lock();
    host_learns(c);
    return sticky_error();
}

cudaError_t do_memset(void *dst, int value, size_t n, cudaStream_t stream, bool sync_call,
                      const char *call)
{
    std::unique_lock<std::mutex> lock(api_mutex());
    zr_emu_stream *s = resolve_stream(sync_call ? nullptr : stream);
    if (s == nullptr) {
        return cudaErrorInvalidResourceHandle;
    }
    if (n == 0) {
        return cudaSuccess;
    }
    if (dst == nullptr) {
        return cudaErrorInvalidValue;
    }
    alloc_view d;
    if (!check_side(dst, n, call, "destination", &d)) {
        return cudaErrorInvalidValue;
    }
    if (d.kind == MEM_PAGEABLE) {
        emu_error("%s(%p): not device memory (pageable host memory)", call, dst);
        return cudaErrorInvalidValue;
    }
    auto *o = new memset_op;
    o->dst = dst;
    o->value = value;
    o->n = n;
    std::vector<mem_access> acc{mem_access{dst, n, true, "destination"}};
    vclock c;
    uint64_t seq = s->enqueued + 1;
    cudaError_t e = enqueue(s, o, call, acc, &c);
    /* cudaMemset is asynchronous for device memory, synchronous for pinned */
    if (e != cudaSuccess || !(sync_call && d.kind == MEM_PINNED)) {
        return e;
    }
    lock.unlock();
    wait_completed(s, seq);
    lock.lock();
    host_learns(c);
    return sticky_error();
}

} // namespace

extern "C" {

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    ZR_EMU_ENTER("cudaMemcpy");
    return set_last_error(do_copy(dst, src, count, kind, nullptr, true, "cudaMemcpy"));
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    ZR_EMU_ENTER("cudaMemcpyAsync");
    return set_last_error(do_copy(dst, src, count, kind, stream, false, "cudaMemcpyAsync"));
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    ZR_EMU_ENTER("cudaMemset");
    return set_last_error(do_memset(devPtr, value, count, nullptr, true, "cudaMemset"));
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    ZR_EMU_ENTER("cudaMemsetAsync");
    return set_last_error(do_memset(devPtr, value, count, stream, false, "cudaMemsetAsync"));
}

} /* extern "C" */
