/*
 * runtime.cpp - the GPU emulator's runtime API: configuration, errors,
 * devices, memory, copies and memsets (tests/emu, issue 23).
 *
 * CUDA's rules, kept where they decide whether a test can see a bug:
 *   - device memory is filled with 0xFF bytes at cudaMalloc (a float NaN), so
 *     a kernel or a copy that reads memory nobody wrote shows it;
 *   - an error CUDA reports (a bad argument, no device, out of memory, a bad
 *     launch configuration) is returned the same way, not printed;
 *   - what CUDA does not report (a race, a kernel's undefined behaviour, a
 *     copy out of its allocation, a freed pointer) is an emulator error:
 *     printed, counted, and the device fails from then on like a GPU after a
 *     kernel fault (every call returns cudaErrorLaunchFailure). Errors the
 *     program never took back (zr_emu_take_errors) make it exit with 1;
 *   - copies and memsets wait for the host exactly where CUDA's documented
 *     "API synchronization behavior" says they do, and nowhere else, so a
 *     program that relies on an implicit wait CUDA does not make is caught.
 */
#include "emu.h"
#include "zr_emu.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <ctime>
#include <map>

namespace zr_emu {

/* ---- configuration ---------------------------------------------------------- */

static config g_cfg;
static std::once_flag g_init_once;
static thread_local int t_device = 0;
static thread_local cudaError_t t_last = cudaSuccess;
thread_local bool t_in_host_fn = false;

static double env_double(const char *name, double def)
{
    const char *s = getenv(name);
    if (s == nullptr || s[0] == '\0') {
        return def;
    }
    char *end = nullptr;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v > 0)) {
        fprintf(stderr, "zr-emu: %s=%s is not a positive number; using %g\n", name, s, def);
        return def;
    }
    return v;
}

static void exit_report(void);

static void init(void)
{
    g_cfg.devices = 1;
    g_cfg.no_driver = false;
    const char *d = getenv("ZR_EMU_DEVICES");
    if (d != nullptr && d[0] != '\0') {
        char *end = nullptr;
        long v = strtol(d, &end, 10);
        if (strcmp(d, "nodriver") == 0) {
            g_cfg.devices = 0;
            g_cfg.no_driver = true;
        } else if (end != d && *end == '\0' && v >= 0 && v <= 16) {
            g_cfg.devices = (int)v;
        } else {
            fprintf(stderr, "zr-emu: ZR_EMU_DEVICES=%s is not 0..16 or 'nodriver'; using 1\n", d);
        }
    }
    g_cfg.watchdog_s = env_double("ZR_EMU_WATCHDOG_S", 20.0);
    g_cfg.mem_bytes = (size_t)(env_double("ZR_EMU_MEM_MB", 16384.0) * 1024.0 * 1024.0);
    g_cfg.sms = (int)env_double("ZR_EMU_SMS", 4.0);
    const char *a = getenv("ZR_EMU_ABORT");
    g_cfg.abort_on_error = a != nullptr && strcmp(a, "1") == 0;
    atexit(exit_report);
}

const config &cfg(void)
{
    std::call_once(g_init_once, init);
    return g_cfg;
}

int current_device(void)
{
    return t_device;
}

std::mutex &api_mutex(void)
{
    static std::mutex *m = new std::mutex; /* never destroyed: workers outlive exit */
    return *m;
}

/* ---- errors ------------------------------------------------------------------ */

static std::mutex g_err_mu;
static std::string g_err_last;
static std::atomic<int> g_err_count{0};
static std::atomic<int> g_sticky{cudaSuccess};

void emu_error(const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    {
        std::lock_guard<std::mutex> lock(g_err_mu);
        g_err_last = buf;
    }
    fprintf(stderr, "zr-emu: error: %s\n", buf);
    fflush(stderr);
    g_err_count.fetch_add(1);
    g_sticky.store(cudaErrorLaunchFailure);
    if (cfg().abort_on_error) {
        abort();
    }
}

cudaError_t sticky_error(void)
{
    return (cudaError_t)g_sticky.load();
}

cudaError_t set_last_error(cudaError_t e)
{
    if (e != cudaSuccess) {
        t_last = e;
    }
    return e;
}

/* Unacknowledged emulator errors fail the process even if it ignored every
 * error code; the streams are drained first so no worker writes into memory
 * that exit is tearing down. */
static void exit_report(void)
{
    if (g_cfg.devices > 0) {
        sync_device(-1, 10.0);
    }
    int n = g_err_count.load();
    if (n > 0) {
        fprintf(stderr, "zr-emu: %d emulator error(s) in this run (see above): exit status 1\n", n);
        fflush(nullptr);
        _exit(1);
    }
}

cudaError_t api_enter(const char *call, bool check_sticky)
{
    const config &c = cfg();
    if (in_kernel_thread()) {
        emu_error("%s called from a kernel: device code cannot call the runtime API", call);
        return cudaErrorNotPermitted;
    }
    if (t_in_host_fn) {
        emu_error("%s called from a host function (cudaLaunchHostFunc), which CUDA forbids", call);
        return cudaErrorNotPermitted;
    }
    if (c.no_driver) {
        return cudaErrorInsufficientDriver;
    }
    if (c.devices == 0) {
        return cudaErrorNoDevice;
    }
    if (check_sticky && sticky_error() != cudaSuccess) {
        return sticky_error();
    }
    return cudaSuccess;
}

/* ---- waiting ----------------------------------------------------------------- */

void futex_wait(std::atomic<uint32_t> *word, uint32_t seen, double timeout_s)
{
    struct timespec ts, *tp = nullptr;
    if (timeout_s > 0) {
        ts.tv_sec = (time_t)timeout_s;
        ts.tv_nsec = (long)((timeout_s - (double)ts.tv_sec) * 1e9);
        tp = &ts;
    }
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT_PRIVATE, seen, tp, nullptr,
            0);
}

void futex_wake_all(std::atomic<uint32_t> *word)
{
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
}

double now_ms(void)
{
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

} // namespace zr_emu

using namespace zr_emu;

#define ENTER(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = api_enter(call);                                                          \
        if (e_ != cudaSuccess) {                                                                   \
            return set_last_error(e_);                                                             \
        }                                                                                          \
    } while (0)

extern "C" {

int zr_emu_error_count(void)
{
    return g_err_count.load();
}

int zr_emu_take_errors(char *msg, size_t cap)
{
    if (msg != nullptr && cap > 0) {
        std::lock_guard<std::mutex> lock(g_err_mu);
        snprintf(msg, cap, "%s", g_err_last.c_str());
    }
    {
        std::lock_guard<std::mutex> lock(api_mutex());
        race_reset();
    }
    g_sticky.store(cudaSuccess);
    t_last = cudaSuccess;
    return g_err_count.exchange(0);
}

/* ---- errors ---------------------------------------------------------------------- */

struct error_text {
    cudaError_t e;
    const char *name, *text;
};
static const error_text k_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorString(cudaError_t error)
{
    for (const error_text &t : k_errors) {
        if (t.e == error) {
            return t.text;
        }
    }
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error)
{
    for (const error_text &t : k_errors) {
        if (t.e == error) {
            return t.name;
        }
    }
    return "unrecognized error code";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t s = sticky_error();
    if (s != cudaSuccess) {
        return s;
    }
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    cudaError_t s = sticky_error();
    return s != cudaSuccess ? s : t_last;
}

/* ---- devices ---------------------------------------------------------------------- */

cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (driverVersion == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    *driverVersion = cfg().no_driver ? 0 : 13000;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (runtimeVersion == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (count == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    *count = 0;
    cudaError_t e = api_enter("cudaGetDeviceCount", false);
    if (e != cudaSuccess) {
        return set_last_error(e);
    }
    *count = cfg().devices;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    ENTER("cudaSetDevice");
    if (device < 0 || device >= cfg().devices) {
        return set_last_error(cudaErrorInvalidDevice);
    }
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    ENTER("cudaGetDevice");
    if (device == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    *device = t_device;
    return cudaSuccess;
}

/* An H100-like device with few SMs, so grids sized from the SM count stay
 * small enough for the CPU. */
static void fill_props(struct cudaDeviceProp *p, int device)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "zr GPU emulator (device %d, CPU threads)", device);
    for (int i = 0; i < 16; i++) {
        p->uuid.bytes[i] = (char)(0x5a ^ (i * 17) ^ device);
    }
    p->totalGlobalMem = cfg().mem_bytes;
    p->sharedMemPerBlock = kSharedPerBlock;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = cfg().sms;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->pciBusID = 0x10 + device;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->sharedMemPerBlockOptin = kSharedOptin;
    p->maxBlocksPerMultiProcessor = 32;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    ENTER("cudaGetDeviceProperties");
    if (prop == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    if (device < 0 || device >= cfg().devices) {
        return set_last_error(cudaErrorInvalidDevice);
    }
    fill_props(prop, device);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    ENTER("cudaDeviceGetAttribute");
    if (value == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    if (device < 0 || device >= cfg().devices) {
        return set_last_error(cudaErrorInvalidDevice);
    }
    struct cudaDeviceProp p;
    fill_props(&p, device);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
        *value = p.maxThreadsPerBlock;
        break;
    case cudaDevAttrMaxBlockDimX:
        *value = p.maxThreadsDim[0];
        break;
    case cudaDevAttrMaxBlockDimY:
        *value = p.maxThreadsDim[1];
        break;
    case cudaDevAttrMaxBlockDimZ:
        *value = p.maxThreadsDim[2];
        break;
    case cudaDevAttrMaxGridDimX:
        *value = p.maxGridSize[0];
        break;
    case cudaDevAttrMaxGridDimY:
        *value = p.maxGridSize[1];
        break;
    case cudaDevAttrMaxGridDimZ:
        *value = p.maxGridSize[2];
        break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
        *value = (int)p.sharedMemPerBlock;
        break;
    case cudaDevAttrWarpSize:
        *value = p.warpSize;
        break;
    case cudaDevAttrMultiProcessorCount:
        *value = p.multiProcessorCount;
        break;
    case cudaDevAttrIntegrated:
        *value = p.integrated;
        break;
    case cudaDevAttrCanMapHostMemory:
        *value = p.canMapHostMemory;
        break;
    case cudaDevAttrConcurrentKernels:
        *value = p.concurrentKernels;
        break;
    case cudaDevAttrPciBusId:
        *value = p.pciBusID;
        break;
    case cudaDevAttrPciDeviceId:
        *value = p.pciDeviceID;
        break;
    case cudaDevAttrGlobalMemoryBusWidth:
        *value = p.memoryBusWidth;
        break;
    case cudaDevAttrL2CacheSize:
        *value = p.l2CacheSize;
        break;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
        *value = p.maxThreadsPerMultiProcessor;
        break;
    case cudaDevAttrAsyncEngineCount:
        *value = p.asyncEngineCount;
        break;
    case cudaDevAttrUnifiedAddressing:
        *value = p.unifiedAddressing;
        break;
    case cudaDevAttrPciDomainId:
        *value = p.pciDomainID;
        break;
    case cudaDevAttrComputeCapabilityMajor:
        *value = p.major;
        break;
    case cudaDevAttrComputeCapabilityMinor:
        *value = p.minor;
        break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
        *value = (int)p.sharedMemPerMultiprocessor;
        break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
        *value = (int)p.sharedMemPerBlockOptin;
        break;
    default:
        return set_last_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

} /* extern "C" */

/* ---- memory ----------------------------------------------------------------------- */

static size_t g_dev_bytes[16]; /* under api_mutex */

extern "C" {

cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    ENTER("cudaMemGetInfo");
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
    ENTER("cudaMalloc");
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
    ENTER("cudaHostAlloc");
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
        host_wait = d.kind == MEM_PAGEABLE;
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
    ENTER("cudaMemcpy");
    return set_last_error(do_copy(dst, src, count, kind, nullptr, true, "cudaMemcpy"));
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    ENTER("cudaMemcpyAsync");
    return set_last_error(do_copy(dst, src, count, kind, stream, false, "cudaMemcpyAsync"));
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    ENTER("cudaMemset");
    return set_last_error(do_memset(devPtr, value, count, nullptr, true, "cudaMemset"));
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    ENTER("cudaMemsetAsync");
    return set_last_error(do_memset(devPtr, value, count, stream, false, "cudaMemsetAsync"));
}

} /* extern "C" */
