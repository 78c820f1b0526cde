/*
 * launch.cpp - the host side of a kernel launch in the GPU emulator
 * (tests/emu, issue 23).
 *
 * zr_emu_launch (cuda_runtime.h) converts the arguments and describes each
 * pointer parameter; here the launch is checked as CUDA checks it (grid and
 * block limits, shared memory: cudaErrorInvalidConfiguration or
 * cudaErrorInvalidValue, not sticky), every pointer argument must point into
 * device or pinned memory of the launch's device (a host or freed pointer is
 * an emulator error, where a GPU would fault), and the kernel is queued on
 * its stream with one access per pointer argument for the race detector: a
 * read through `const T *`, a write through `T *`, of the element it points
 * at. kernel.cpp runs it.
 */
#include "emu.h"

#include <atomic>
#include <unordered_map>

namespace zr_emu {

namespace {

std::mutex g_attr_mu;
std::atomic<long long> g_kernels{0}, g_gemms{0};        /* zr_emu_launch_counts */
std::unordered_map<const void *, size_t> g_max_dynamic; /* cudaFuncSetAttribute */

size_t static_bytes(const void *fn)
{
    size_t total = 0;
    for (const shared_var &v : static_shared_of(fn)) {
        total += v.size;
    }
    return total;
}

size_t func_max_dynamic_shared(const void *kernel)
{
    std::lock_guard<std::mutex> lock(g_attr_mu);
    auto it = g_max_dynamic.find(kernel);
    return it == g_max_dynamic.end() ? 0 : it->second;
}

/* CUDA's launch limits and the shared memory budget; false (after a note)
 * when the launch must be refused. */
bool config_ok(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shmem,
               cudaError_t *err)
{
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024 ||
        grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr,
                "zr-emu: launch of '%s' with grid (%u,%u,%u), block (%u,%u,%u): invalid "
                "configuration (at most 1024 threads per block, block z <= 64, grid y,z <= "
                "65535, no zero)\n",
                name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        *err = cudaErrorInvalidConfiguration;
        return false;
    }
    size_t stat = static_bytes(kernel);
    size_t optin = func_max_dynamic_shared(kernel);
    size_t limit = optin > 0 ? optin : (stat < kSharedPerBlock ? kSharedPerBlock - stat : 0);
    if (shmem > limit || stat > kSharedPerBlock) {
        fprintf(stderr,
                "zr-emu: launch of '%s': %zu bytes of dynamic shared memory, %zu static; the "
                "limit is %zu dynamic (48 KiB in all unless cudaFuncSetAttribute raises it)\n",
                name, shmem, stat, limit);
        *err = cudaErrorInvalidValue;
        return false;
    }
    return true;
}

/* The accesses of a launch on stream s through its pointer arguments; false
 * (after an emulator error) for a pointer a GPU could not follow. Under
 * api_mutex. */
bool pointer_accesses(const char *name, const zr_emu_stream *s, const arg_info *args, int nargs,
                      std::vector<mem_access> *acc)
{
    for (int i = 0; i < nargs; i++) {
        const arg_info &a = args[i];
        if (!a.pointer || a.ptr == nullptr) {
            continue;
        }
        bool at_end = false;
        alloc_view v = alloc_find(a.ptr, &at_end);
        if (v.kind == MEM_PAGEABLE && at_end) {
            continue; /* one past the end: a valid pointer to nothing */
        }
        if (v.kind == MEM_PAGEABLE || (v.kind == MEM_DEVICE && v.device != s->device)) {
            std::string freed = alloc_freed_note(a.ptr);
            char what[160];
            snprintf(what, sizeof what, "memory of device %d, not of the launch's device %d",
                     v.device, s->device);
            emu_error("kernel '%s': argument %d = %p is %s", name, i + 1, a.ptr,
                      !freed.empty()           ? freed.c_str()
                      : v.kind == MEM_PAGEABLE ? "not device memory (a host pointer? "
                                                 "cudaMalloc or cudaMallocHost memory only)"
                                               : what);
            return false;
        }
        char what[96];
        snprintf(what, sizeof what, "argument %d, a %s pointer", i + 1,
                 a.write ? "non-const" : "const");
        acc->push_back(mem_access{a.ptr, a.bytes, a.write != 0, what});
    }
    return true;
}

} // namespace

cudaError_t launch(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shmem,
                   cudaStream_t stream, launch_body *body, const arg_info *args, int nargs)
{
    std::unique_ptr<launch_body> own(body);
    cudaError_t e = api_enter("a kernel launch");
    if (e != cudaSuccess || !config_ok(name, kernel, grid, block, shmem, &e)) {
        return set_last_error(e);
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_stream *s = resolve_stream(stream);
    if (s == nullptr) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    std::vector<mem_access> acc;
    if (!pointer_accesses(name, s, args, nargs, &acc)) {
        return set_last_error(cudaErrorLaunchFailure);
    }
    op *o = make_kernel_op(name, kernel, grid, block, shmem, std::move(own));
    std::string what = std::string("kernel '") + name + "'";
    e = enqueue(s, o, what.c_str(), acc);
    if (e == cudaSuccess) {
        count_kernel();
    }
    return set_last_error(e);
}

void count_kernel()
{
    g_kernels.fetch_add(1, std::memory_order_relaxed);
}

void count_gemm()
{
    g_gemms.fetch_add(1, std::memory_order_relaxed);
}

} // namespace zr_emu

extern "C" void zr_emu_launch_counts(long long *kernels, long long *gemms)
{
    *kernels = zr_emu::g_kernels.load(std::memory_order_relaxed);
    *gemms = zr_emu::g_gemms.load(std::memory_order_relaxed);
}

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr,
                                            int value)
{
    using namespace zr_emu;
    cudaError_t e = api_enter("cudaFuncSetAttribute");
    if (e != cudaSuccess) {
        return set_last_error(e);
    }
    if (func == nullptr) {
        return set_last_error(cudaErrorInvalidDeviceFunction);
    }
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value + static_bytes(func) > kSharedOptin) {
        return set_last_error(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(g_attr_mu);
    g_max_dynamic[func] = (size_t)value;
    return cudaSuccess;
}
