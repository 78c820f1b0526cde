/*
 * cuda_runtime.h - the kernel side of the GPU emulator (tests/emu, issue 23).
 *
 * A .cu file of zr compiles twice from one source: by nvcc for the GPU, and
 * by g++ as C++ against this header for the CPU test suite. Here the CUDA
 * qualifiers are empty or plain C++, the index variables are thread-locals
 * set for the fiber that plays a CUDA thread, and barriers, warp shuffles and
 * votes call into libzremu.a, which runs each launch block by block with one
 * fiber per CUDA thread (tests/emu/README.md). Kernels are launched with
 * ZR_LAUNCH (src/base/cuda_kernel.h), which expands to zr_emu_launch here and
 * to <<<...>>> under nvcc.
 *
 * Every CUDA undefined behaviour the emulator can see is a loud error: the
 * launch fails (cudaErrorLaunchFailure, sticky) with a message naming the
 * kernel, the block, the thread and the source line. The rules of each
 * intrinsic are CUDA's (the programming guide and the PTX ISA); where a rule
 * leaves the result undefined, the emulator reports an error instead of
 * inventing a value.
 *
 * Not provided (a kernel that uses them does not compile here): __constant__
 * and __device__ variables, inline PTX, textures, cooperative groups, fp16.
 */
#ifndef ZR_EMU_CUDA_RUNTIME_H
#define ZR_EMU_CUDA_RUNTIME_H

#ifndef __cplusplus
#error "cuda_runtime.h is the kernel side (C++); C code includes cuda_runtime_api.h"
#endif

#include "cuda_runtime_api.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers -------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* Static shared memory is a function-local static: blocks run one at a time
 * in the whole process, and before each block the emulator overwrites the
 * kernel's statics with 0xFF (found by name in the symbol table), so a read
 * of shared memory the block has not written gives NaN, never the previous
 * block's data. Declare __shared__ arrays in the __global__ function itself:
 * those of a __device__ helper are not poisoned. */
#define __shared__ static

/* ---- vector types ------------------------------------------------------ */

struct uint3 {
    unsigned int x, y, z;
};

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz)
    {
    }
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const
    {
        return uint3{x, y, z};
    }
};

struct __align__(4) char4
{
    signed char x, y, z, w;
};
struct __align__(4) uchar4
{
    unsigned char x, y, z, w;
};
struct __align__(8) int2
{
    int x, y;
};
struct __align__(16) int4
{
    int x, y, z, w;
};
struct __align__(8) uint2
{
    unsigned int x, y;
};
struct __align__(16) uint4
{
    unsigned int x, y, z, w;
};
struct __align__(8) float2
{
    float x, y;
};
struct __align__(16) float4
{
    float x, y, z, w;
};
struct __align__(16) double2
{
    double x, y;
};

static inline char4 make_char4(signed char x, signed char y, signed char z, signed char w)
{
    return char4{x, y, z, w};
}
static inline uchar4 make_uchar4(unsigned char x, unsigned char y, unsigned char z, unsigned char w)
{
    return uchar4{x, y, z, w};
}
static inline int2 make_int2(int x, int y)
{
    return int2{x, y};
}
static inline int4 make_int4(int x, int y, int z, int w)
{
    return int4{x, y, z, w};
}
static inline uint2 make_uint2(unsigned int x, unsigned int y)
{
    return uint2{x, y};
}
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w)
{
    return uint4{x, y, z, w};
}
static inline float2 make_float2(float x, float y)
{
    return float2{x, y};
}
static inline float4 make_float4(float x, float y, float z, float w)
{
    return float4{x, y, z, w};
}
static inline double2 make_double2(double x, double y)
{
    return double2{x, y};
}

/* ---- built-in variables ------------------------------------------------ */

/* Set by the emulator for the fiber that plays a CUDA thread (the fibers of a
 * block share their OS thread, which sets them at every switch); read-only
 * for kernels, as in CUDA. */
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
static constexpr int warpSize = 32;

/* ---- the emulator's kernel-side entry points (tests/emu/kernel.cpp) ----- */

namespace zr_emu {

enum shfl_mode { SHFL_IDX = 0, SHFL_UP = 1, SHFL_DOWN = 2, SHFL_XOR = 3 };

struct vote_result {
    unsigned int ballot; /* lanes whose predicate was non-zero */
    unsigned int active; /* lanes of the mask that took part (not exited) */
};

void syncthreads(const char *file, int line);
void syncwarp(unsigned int mask, const char *file, int line);
unsigned long long shfl(unsigned int mask, unsigned long long value, shfl_mode mode, unsigned int b,
                        int width, const char *what, const char *file, int line);
vote_result vote(unsigned int mask, int pred, const char *what, const char *file, int line);
void *dynamic_shared(void);
[[noreturn]] void trap(const char *what, const char *file, int line);

template <typename T>
inline T shfl_as(unsigned int mask, T var, shfl_mode mode, unsigned int b, int width,
                 const char *what, const char *file, int line)
{
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                  "shuffles move values of up to 8 bytes");
    unsigned long long bits = 0;
    memcpy(&bits, &var, sizeof(T));
    bits = shfl(mask, bits, mode, b, width, what, file, line);
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}

} // namespace zr_emu

/* ---- barriers, shuffles, votes ----------------------------------------- */

inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    zr_emu::syncthreads(file, line);
}

inline void __syncwarp(unsigned int mask = 0xffffffffu, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE())
{
    zr_emu::syncwarp(mask, file, line);
}

template <typename T>
inline T __shfl_sync(unsigned int mask, T var, int srcLane, int width = warpSize,
                     const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return zr_emu::shfl_as<T>(mask, var, zr_emu::SHFL_IDX, (unsigned int)srcLane, width,
                              "__shfl_sync", file, line);
}

template <typename T>
inline T __shfl_up_sync(unsigned int mask, T var, unsigned int delta, int width = warpSize,
                        const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return zr_emu::shfl_as<T>(mask, var, zr_emu::SHFL_UP, delta, width, "__shfl_up_sync", file,
                              line);
}

template <typename T>
inline T __shfl_down_sync(unsigned int mask, T var, unsigned int delta, int width = warpSize,
                          const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return zr_emu::shfl_as<T>(mask, var, zr_emu::SHFL_DOWN, delta, width, "__shfl_down_sync", file,
                              line);
}

template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T var, int laneMask, int width = warpSize,
                         const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return zr_emu::shfl_as<T>(mask, var, zr_emu::SHFL_XOR, (unsigned int)laneMask, width,
                              "__shfl_xor_sync", file, line);
}

inline unsigned int __ballot_sync(unsigned int mask, int pred, const char *file = __builtin_FILE(),
                                  int line = __builtin_LINE())
{
    return zr_emu::vote(mask, pred, "__ballot_sync", file, line).ballot;
}

inline int __any_sync(unsigned int mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE())
{
    return zr_emu::vote(mask, pred, "__any_sync", file, line).ballot != 0;
}

inline int __all_sync(unsigned int mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE())
{
    zr_emu::vote_result r = zr_emu::vote(mask, pred, "__all_sync", file, line);
    return r.ballot == r.active;
}

/* No memory is visible out of order on the CPU that a fence would order: the
 * blocks run one after another, and a block's threads order their accesses
 * with __syncthreads, which is a real barrier here. Under ThreadSanitizer
 * (which does not model standalone fences) it is a compiler barrier. */
inline void __threadfence(void)
{
#if defined(__SANITIZE_THREAD__)
    __asm__ __volatile__("" ::: "memory");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

inline void __threadfence_block(void)
{
    __threadfence();
}

[[noreturn]] inline void __trap(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    zr_emu::trap("__trap()", file, line);
}

/* ---- atomics (relaxed, as CUDA's) -------------------------------------- */

#define ZR_EMU_ATOMIC_RMW(name, type, builtin)                                                     \
    inline type name(type *address, type val)                                                      \
    {                                                                                              \
        return builtin(address, val, __ATOMIC_RELAXED);                                            \
    }
ZR_EMU_ATOMIC_RMW(atomicAdd, int, __atomic_fetch_add)
ZR_EMU_ATOMIC_RMW(atomicAdd, unsigned int, __atomic_fetch_add)
ZR_EMU_ATOMIC_RMW(atomicAdd, unsigned long long, __atomic_fetch_add)
ZR_EMU_ATOMIC_RMW(atomicSub, int, __atomic_fetch_sub)
ZR_EMU_ATOMIC_RMW(atomicSub, unsigned int, __atomic_fetch_sub)
ZR_EMU_ATOMIC_RMW(atomicAnd, int, __atomic_fetch_and)
ZR_EMU_ATOMIC_RMW(atomicAnd, unsigned int, __atomic_fetch_and)
ZR_EMU_ATOMIC_RMW(atomicAnd, unsigned long long, __atomic_fetch_and)
ZR_EMU_ATOMIC_RMW(atomicOr, int, __atomic_fetch_or)
ZR_EMU_ATOMIC_RMW(atomicOr, unsigned int, __atomic_fetch_or)
ZR_EMU_ATOMIC_RMW(atomicOr, unsigned long long, __atomic_fetch_or)
ZR_EMU_ATOMIC_RMW(atomicXor, int, __atomic_fetch_xor)
ZR_EMU_ATOMIC_RMW(atomicXor, unsigned int, __atomic_fetch_xor)
ZR_EMU_ATOMIC_RMW(atomicXor, unsigned long long, __atomic_fetch_xor)
ZR_EMU_ATOMIC_RMW(atomicExch, int, __atomic_exchange_n)
ZR_EMU_ATOMIC_RMW(atomicExch, unsigned int, __atomic_exchange_n)
ZR_EMU_ATOMIC_RMW(atomicExch, unsigned long long, __atomic_exchange_n)
#undef ZR_EMU_ATOMIC_RMW

template <typename T> inline T atomicCAS(T *address, T compare, T val)
{
    static_assert(std::is_same<T, int>::value || std::is_same<T, unsigned int>::value ||
                      std::is_same<T, unsigned long long>::value ||
                      std::is_same<T, unsigned short>::value,
                  "atomicCAS takes int, unsigned int, unsigned long long or unsigned short");
    __atomic_compare_exchange_n(address, &compare, val, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}

namespace zr_emu {
/* a read-modify-write that CUDA has and the builtins lack, as a CAS loop */
template <typename T, typename F> inline T atomic_update(T *address, F f)
{
    T old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(address, &old, f(old), true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return old;
}
template <typename T, typename U> inline T atomic_float_add(T *address, T val)
{
    U *bits = reinterpret_cast<U *>(address);
    return atomic_update(bits, [val](U o) {
        T f;
        memcpy(&f, &o, sizeof f);
        f = f + val;
        U n;
        memcpy(&n, &f, sizeof n);
        return n;
    });
}
} // namespace zr_emu

inline float atomicAdd(float *address, float val)
{
    unsigned int old = zr_emu::atomic_float_add<float, unsigned int>(address, val);
    float f;
    memcpy(&f, &old, sizeof f);
    return f;
}

inline double atomicAdd(double *address, double val)
{
    unsigned long long old = zr_emu::atomic_float_add<double, unsigned long long>(address, val);
    double f;
    memcpy(&f, &old, sizeof f);
    return f;
}

#define ZR_EMU_ATOMIC_MINMAX(name, type, pick)                                                     \
    inline type name(type *address, type val)                                                      \
    {                                                                                              \
        return zr_emu::atomic_update(address, [val](type o) { return pick; });                     \
    }
ZR_EMU_ATOMIC_MINMAX(atomicMax, int, o > val ? o : val)
ZR_EMU_ATOMIC_MINMAX(atomicMax, unsigned int, o > val ? o : val)
ZR_EMU_ATOMIC_MINMAX(atomicMax, long long, o > val ? o : val)
ZR_EMU_ATOMIC_MINMAX(atomicMax, unsigned long long, o > val ? o : val)
ZR_EMU_ATOMIC_MINMAX(atomicMin, int, o < val ? o : val)
ZR_EMU_ATOMIC_MINMAX(atomicMin, unsigned int, o < val ? o : val)
ZR_EMU_ATOMIC_MINMAX(atomicMin, long long, o < val ? o : val)
ZR_EMU_ATOMIC_MINMAX(atomicMin, unsigned long long, o < val ? o : val)
#undef ZR_EMU_ATOMIC_MINMAX

/* ---- conversions and arithmetic with an explicit rounding ---------------- */

/* float -> integer, round to nearest even; saturating, NaN -> 0 (PTX cvt.rni) */
inline int __float2int_rn(float x)
{
    if (x != x) {
        return 0;
    }
    if (x >= 2147483648.0f) {
        return INT_MAX;
    }
    if (x < -2147483648.0f) {
        return INT_MIN;
    }
    return (int)rintf(x);
}

inline int __float2int_rz(float x)
{
    if (x != x) {
        return 0;
    }
    if (x >= 2147483648.0f) {
        return INT_MAX;
    }
    if (x < -2147483648.0f) {
        return INT_MIN;
    }
    return (int)x;
}

inline unsigned int __float2uint_rn(float x)
{
    if (x != x || x <= 0.0f) {
        return 0;
    }
    if (x >= 4294967296.0f) {
        return UINT_MAX;
    }
    return (unsigned int)rintf(x);
}

inline float __int2float_rn(int x)
{
    return (float)x;
}
inline float __uint2float_rn(unsigned int x)
{
    return (float)x;
}

/* Built with -ffp-contract=off, so each of these is one IEEE operation. */
inline float __fadd_rn(float a, float b)
{
    return a + b;
}
inline float __fsub_rn(float a, float b)
{
    return a - b;
}
inline float __fmul_rn(float a, float b)
{
    return a * b;
}
inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
inline float __fdividef(float a, float b)
{
    return a / b;
}
inline float __frcp_rn(float a)
{
    return 1.0f / a;
}
inline float __fsqrt_rn(float a)
{
    return sqrtf(a);
}
inline float __fmaf_rn(float a, float b, float c)
{
    return fmaf(a, b, c);
}
inline double __dadd_rn(double a, double b)
{
    return a + b;
}
inline double __dmul_rn(double a, double b)
{
    return a * b;
}

inline unsigned int __float_as_uint(float x)
{
    unsigned int u;
    memcpy(&u, &x, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned int u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
inline int __float_as_int(float x)
{
    int i;
    memcpy(&i, &x, sizeof i);
    return i;
}
inline float __int_as_float(int i)
{
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
}

/* ---- bit operations ------------------------------------------------------ */

inline int __popc(unsigned int x)
{
    return __builtin_popcount(x);
}
inline int __popcll(unsigned long long x)
{
    return __builtin_popcountll(x);
}
inline int __clz(int x)
{
    return x == 0 ? 32 : __builtin_clz((unsigned int)x);
}
inline int __clzll(long long x)
{
    return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
inline int __ffs(int x)
{
    return __builtin_ffs(x);
}
inline int __ffsll(long long x)
{
    return __builtin_ffsll(x);
}
inline unsigned int __brev(unsigned int x)
{
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
inline unsigned int __umulhi(unsigned int a, unsigned int b)
{
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}
inline int __mulhi(int a, int b)
{
    return (int)(((long long)a * b) >> 32);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b)
{
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

/* ---- loads --------------------------------------------------------------- */

template <typename T> inline T __ldg(const T *ptr)
{
    return *ptr;
}

/* ---- CUDA's global min / max (math_functions.h) -------------------------- */

#define ZR_EMU_MINMAX(ret, ta, tb)                                                                 \
    inline ret min(ta a, tb b)                                                                     \
    {                                                                                              \
        return (ret)a < (ret)b ? (ret)a : (ret)b;                                                  \
    }                                                                                              \
    inline ret max(ta a, tb b)                                                                     \
    {                                                                                              \
        return (ret)a > (ret)b ? (ret)a : (ret)b;                                                  \
    }
ZR_EMU_MINMAX(int, int, int)
ZR_EMU_MINMAX(unsigned int, unsigned int, unsigned int)
ZR_EMU_MINMAX(unsigned int, int, unsigned int)
ZR_EMU_MINMAX(unsigned int, unsigned int, int)
ZR_EMU_MINMAX(long, long, long)
ZR_EMU_MINMAX(unsigned long, unsigned long, unsigned long)
ZR_EMU_MINMAX(unsigned long, long, unsigned long)
ZR_EMU_MINMAX(unsigned long, unsigned long, long)
ZR_EMU_MINMAX(long long, long long, long long)
ZR_EMU_MINMAX(unsigned long long, unsigned long long, unsigned long long)
ZR_EMU_MINMAX(unsigned long long, long long, unsigned long long)
ZR_EMU_MINMAX(unsigned long long, unsigned long long, long long)
#undef ZR_EMU_MINMAX
inline float min(float a, float b)
{
    return fminf(a, b);
}
inline float max(float a, float b)
{
    return fmaxf(a, b);
}
inline double min(double a, double b)
{
    return fmin(a, b);
}
inline double max(double a, double b)
{
    return fmax(a, b);
}

/* ---- launches -------------------------------------------------------------- */

namespace zr_emu {

/* A kernel's pointer argument: what the race detector records for it. */
struct arg_info {
    const void *ptr;
    size_t bytes; /* the element it points at (1 for void) */
    int write;    /* 1 for T *, 0 for const T * */
    int pointer;  /* 0: not a pointer, nothing to record */
};

/* One launch: the kernel and its arguments, run by every CUDA thread. */
class launch_body {
  public:
    virtual ~launch_body() {}
    virtual void run_thread() const = 0;
};

template <typename... P> class launch_of : public launch_body {
    void (*fn_)(P...);
    std::tuple<typename std::decay<P>::type...> args_;

  public:
    template <typename... A>
    explicit launch_of(void (*fn)(P...), A &&...args) : fn_(fn), args_(std::forward<A>(args)...)
    {
    }
    /* each thread gets its own copy of the parameters, as on a GPU */
    void run_thread() const override
    {
        std::apply(fn_, args_);
    }
    const std::tuple<typename std::decay<P>::type...> &args() const
    {
        return args_;
    }
};

template <typename T> inline arg_info describe_arg(const T &v)
{
    if constexpr (std::is_pointer<T>::value) {
        using E = typename std::remove_pointer<T>::type;
        size_t bytes = 1;
        if constexpr (!std::is_void<E>::value && !std::is_function<E>::value) {
            bytes = sizeof(E);
        }
        return arg_info{(const void *)v, bytes, !std::is_const<E>::value, 1};
    } else {
        return arg_info{nullptr, 0, 0, 0};
    }
}

cudaError_t launch(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shmem,
                   cudaStream_t stream, launch_body *body, const arg_info *args, int nargs);

} // namespace zr_emu

/* The emulator's <<<grid, block, shmem, stream>>>(args...), through ZR_LAUNCH:
 * the arguments are converted to the kernel's parameter types once, here. */
template <typename... P, typename... A>
inline cudaError_t zr_emu_launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block,
                                 size_t shmem, cudaStream_t stream, A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong argument count");
    auto *body = new zr_emu::launch_of<P...>(kernel, std::forward<A>(args)...);
    zr_emu::arg_info info[sizeof...(P) + 1] = {};
    std::apply(
        [&info](const auto &...a) {
            int i = 0;
            ((info[i++] = zr_emu::describe_arg(a)), ...);
            (void)i;
        },
        body->args());
    return zr_emu::launch(name, reinterpret_cast<const void *>(kernel), grid, block, shmem, stream,
                          body, info, (int)sizeof...(P));
}

template <typename T>
inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(entry), attr, value);
}

#endif /* ZR_EMU_CUDA_RUNTIME_H */
