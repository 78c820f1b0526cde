/*
 * runtime.cpp - the GPU emulator's runtime API: configuration, errors and
 * devices (tests/emu, issue 23); memory and copies are in memcpy.cpp.
 *
 * Two kinds of error:
 *   - an error CUDA reports (a bad argument, no device, out of memory, a bad
 *     launch configuration) is returned the same way, not printed, and is not
 *     sticky;
 *   - what CUDA does not report (a race, a kernel's undefined behaviour, a
 *     copy out of its allocation, a freed pointer) is an emulator error:
 *     printed, counted, and the device fails from then on like a GPU after a
 *     kernel fault (every call returns cudaErrorLaunchFailure). Errors the
 *     program never took back (zr_emu_take_errors) make it exit with 1.
 * The device count comes from ZR_EMU_DEVICES, so the "no GPU" paths (no
 * device, no driver) are testable.
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

#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer sleeps a second at exit by default, so that threads still
 * running can report races with what exit tears down. Here nothing runs by
 * then (exit_report below drains every stream first; the fibers run only
 * inside a worker's operation), and a second per process was most of the
 * emu-tsan suite's wall time (test_emu starts several children). TSAN_OPTIONS
 * still overrides it. */
extern "C" const char *__tsan_default_options(void)
{
    return "atexit_sleep_ms=0";
}
#endif

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
    ZR_EMU_ENTER("cudaSetDevice");
    if (device < 0 || device >= cfg().devices) {
        return set_last_error(cudaErrorInvalidDevice);
    }
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    ZR_EMU_ENTER("cudaGetDevice");
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
    ZR_EMU_ENTER("cudaGetDeviceProperties");
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
    ZR_EMU_ENTER("cudaDeviceGetAttribute");
    if (value == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    if (device < 0 || device >= cfg().devices) {
        return set_last_error(cudaErrorInvalidDevice);
    }
    struct cudaDeviceProp p;
    fill_props(&p, device);
    const struct {
        enum cudaDeviceAttr attr;
        long long value;
    } table[] = {
        {cudaDevAttrMaxThreadsPerBlock, p.maxThreadsPerBlock},
        {cudaDevAttrMaxBlockDimX, p.maxThreadsDim[0]},
        {cudaDevAttrMaxBlockDimY, p.maxThreadsDim[1]},
        {cudaDevAttrMaxBlockDimZ, p.maxThreadsDim[2]},
        {cudaDevAttrMaxGridDimX, p.maxGridSize[0]},
        {cudaDevAttrMaxGridDimY, p.maxGridSize[1]},
        {cudaDevAttrMaxGridDimZ, p.maxGridSize[2]},
        {cudaDevAttrMaxSharedMemoryPerBlock, (long long)p.sharedMemPerBlock},
        {cudaDevAttrWarpSize, p.warpSize},
        {cudaDevAttrMultiProcessorCount, p.multiProcessorCount},
        {cudaDevAttrIntegrated, p.integrated},
        {cudaDevAttrCanMapHostMemory, p.canMapHostMemory},
        {cudaDevAttrConcurrentKernels, p.concurrentKernels},
        {cudaDevAttrPciBusId, p.pciBusID},
        {cudaDevAttrPciDeviceId, p.pciDeviceID},
        {cudaDevAttrGlobalMemoryBusWidth, p.memoryBusWidth},
        {cudaDevAttrL2CacheSize, p.l2CacheSize},
        {cudaDevAttrMaxThreadsPerMultiProcessor, p.maxThreadsPerMultiProcessor},
        {cudaDevAttrAsyncEngineCount, p.asyncEngineCount},
        {cudaDevAttrUnifiedAddressing, p.unifiedAddressing},
        {cudaDevAttrPciDomainId, p.pciDomainID},
        {cudaDevAttrComputeCapabilityMajor, p.major},
        {cudaDevAttrComputeCapabilityMinor, p.minor},
        {cudaDevAttrMaxSharedMemoryPerMultiprocessor, (long long)p.sharedMemPerMultiprocessor},
        {cudaDevAttrMaxSharedMemoryPerBlockOptin, (long long)p.sharedMemPerBlockOptin},
    };
    for (const auto &t : table) {
        if (t.attr == attr) {
            *value = (int)t.value;
            return cudaSuccess;
        }
    }
    return set_last_error(cudaErrorInvalidValue);
}

} /* extern "C" */
