/*
 * zr_emu.h - what only the GPU emulator has: its error count, for tests that
 * check that the emulator catches a bug (tests/emu/README.md).
 *
 * An emulator error (a race between streams, a kernel's undefined behaviour,
 * a bad pointer) is printed, counted, and puts the device into CUDA's failed
 * state: every later runtime call returns cudaErrorLaunchFailure. A test
 * that provoked one on purpose takes it back with zr_emu_take_errors(), which
 * returns the count, copies the last message and clears the failed state.
 * Errors nobody took back make the process exit with status 1.
 *
 * Include it only under #if ZR_CUDA_EMU: it does not exist for nvcc.
 */
#ifndef ZR_EMU_H
#define ZR_EMU_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Emulator errors since the start or the last zr_emu_take_errors. */
int zr_emu_error_count(void);

/* Returns the count above and resets it to 0; copies the last error's message
 * (NUL-terminated, truncated to cap) when msg is not NULL; clears the sticky
 * cudaErrorLaunchFailure so the test can go on using the device. */
int zr_emu_take_errors(char *msg, size_t cap);

/* Kernel launches (ZR_LAUNCH) and cuBLAS GEMM calls (cublasGemmEx,
 * cublasGemmStridedBatchedEx) queued since the start, on every stream and
 * thread; a refused launch or call is not counted. Tests take differences
 * (the launches of one training step: tests/test_roofline.c). */
void zr_emu_launch_counts(long long *kernels, long long *gemms);

/* Every ncclSend / ncclRecv as the emulated NCCL takes it (call is "ncclSend" or
 * "ncclRecv", peer the communicator rank, bytes = count * type size), for tests
 * that compare a transport's calls with its plan; NULL stops. Not thread-safe:
 * set it while no NCCL call runs. */
typedef void (*zr_emu_nccl_trace_fn)(void *arg, const char *call, int peer, const void *buf,
                                     size_t bytes);
void zr_emu_nccl_trace(zr_emu_nccl_trace_fn fn, void *arg);

#ifdef __cplusplus
}
#endif

#endif /* ZR_EMU_H */
