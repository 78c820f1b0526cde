/*
 * cuda_kernel.h - the only header a .cu file includes for CUDA itself (zr's
 * CUDA build contract, issue 23).
 *
 * One kernel source builds three ways: nvcc for the GPU, and g++ as C++
 * against the GPU emulator's headers (tests/emu/include, -DZR_CUDA_EMU=1) for
 * the CPU test suite. This header is the thin layer that keeps the source the
 * same for both:
 *
 *   ZR_LAUNCH(kernel, grid, block, shmem_bytes, stream, args...)
 *       launch; every argument is evaluated once. Template kernels go in
 *       parentheses: ZR_LAUNCH((k<int, 8>), ...). Callers read launch errors
 *       with cudaGetLastError(). Pass nullptr, not 0 or NULL, for a null
 *       pointer argument (the emulator converts arguments through a template).
 *   ZR_SHARED_DYNAMIC(type, name)
 *       declares `type *name`, the launch's dynamic shared memory (16-byte
 *       aligned), as a statement in a kernel.
 *   ZR_UNROLL
 *       `#pragma unroll` under nvcc, nothing in the emulator (g++ warns on it).
 *
 * Kernels use only what the emulator provides (tests/emu/README.md): no
 * inline PTX, no __constant__ or __device__ variables, __shared__ arrays in
 * the __global__ function itself.
 */
#ifndef ZR_CUDA_KERNEL_H
#define ZR_CUDA_KERNEL_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "hd.h"

#if defined(ZR_CUDA_EMU) && !defined(__CUDACC__)

#define ZR_LAUNCH(kernel, grid, block, shmem, stream, ...)                                         \
    zr_emu_launch(#kernel, kernel, grid, block, shmem, stream, ##__VA_ARGS__)
#define ZR_SHARED_DYNAMIC(type, name) type *name = static_cast<type *>(zr_emu::dynamic_shared())
#define ZR_UNROLL

#else

#define ZR_LAUNCH(kernel, grid, block, shmem, stream, ...)                                         \
    kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
/* One raw byte array for every kernel: typed extern __shared__ arrays of
 * different types in one translation unit would conflict. */
#define ZR_SHARED_DYNAMIC(type, name)                                                              \
    extern __shared__ __align__(16) unsigned char zr_shared_dynamic_[];                            \
    type *name = reinterpret_cast<type *>(zr_shared_dynamic_)
#define ZR_UNROLL _Pragma("unroll")

#endif

#endif /* ZR_CUDA_KERNEL_H */
