/*
 * cudalib.h - cuBLAS, cuBLASLt and NCCL loaded on first use: a table of the
 * functions zr calls in each library, filled once per process, through
 * which every call site calls them (blas_cuda.c, transport_nccl.c,
 * bench_comm_cuda.c).
 *
 * Why: a program linked against libcudart, libcublas, libcublasLt and
 * libnccl loads them at every start, CPU runs and `zr --help` included (0.9
 * GB more address space, 180 MB more resident memory and 85 ms more CPU time
 * per process, measured with zr --help and a CPU zr train), and cannot start
 * at all on a node without them. The CUDA runtime is linked statically
 * (libcudart_static.a), which opens the driver itself at its first call; the
 * two libraries here are opened by zr_cudalib_load_cublas and
 * zr_cudalib_load_nccl, so a process that never asks for them maps none.
 *
 * Each member keeps the library's name and is declared with __typeof__ of
 * the toolkit header's own prototype, so a signature cannot drift from the
 * header the build compiles against. The emulator build (ZR_CUDA_EMU) fills
 * the same tables with the emulator's functions, linked into the program:
 * everything above the tables is the same code in both builds.
 *
 * Where from, in this order, stopping at the first folder that has every
 * file of the library: the folder the build found the library in (the
 * Makefile's ZR_CUBLAS_DIR, ZR_NCCL_DIR), then the plain soname, which the
 * dynamic loader looks up (LD_LIBRARY_PATH, the system's folders). The
 * soname's major version is the one of the headers the build compiled
 * against (libcublas.so.13, libnccl.so.2 for CUBLAS_VER_MAJOR 13 and
 * NCCL_MAJOR 2). The environment variable ZR_CUDA_LIBDIR=folder replaces
 * that search by the one folder (a toolkit installed elsewhere than at build
 * time; the tests point it at a folder that does not exist). Read once, at
 * the first load.
 *
 * Errors: a library that cannot be opened, or lacks a function, is
 * ZR_ERR_DEVICE naming the library, each file tried and the loader's own
 * message (dlerror), returned by the load, so by the call that needed the
 * library, never at start-up. The outcome is kept: later loads return the
 * same table, or fail with the same message. Thread-safe (pthread_once).
 * Libraries once opened stay open until the process ends.
 */
#ifndef ZR_CUDALIB_H
#define ZR_CUDALIB_H

#include "zr/base.h"

#if ZR_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>

/* The cuBLAS functions zr calls (blas_cuda.c). */
typedef struct zr_cudalib_cublas {
    __typeof__(cublasCreate) *cublasCreate;
    __typeof__(cublasDestroy) *cublasDestroy;
    __typeof__(cublasSetStream) *cublasSetStream;
    __typeof__(cublasSetMathMode) *cublasSetMathMode;
    __typeof__(cublasGemmEx) *cublasGemmEx;
    __typeof__(cublasGemmStridedBatchedEx) *cublasGemmStridedBatchedEx;
    __typeof__(cublasGetStatusName) *cublasGetStatusName;
    __typeof__(cublasGetStatusString) *cublasGetStatusString;
} zr_cudalib_cublas;

/* Open cuBLAS (with cuBLASLt, which it needs) on the first call; *out: its table. */
zr_status zr_cudalib_load_cublas(const zr_cudalib_cublas **out);

/* The cuBLASLt functions zr calls (blas_cuda.c: the GEMMs with epilogues). */
typedef struct zr_cudalib_cublaslt {
    __typeof__(cublasLtCreate) *cublasLtCreate;
    __typeof__(cublasLtDestroy) *cublasLtDestroy;
    __typeof__(cublasLtGetStatusName) *cublasLtGetStatusName;
    __typeof__(cublasLtGetStatusString) *cublasLtGetStatusString;
    __typeof__(cublasLtMatmulDescCreate) *cublasLtMatmulDescCreate;
    __typeof__(cublasLtMatmulDescDestroy) *cublasLtMatmulDescDestroy;
    __typeof__(cublasLtMatmulDescSetAttribute) *cublasLtMatmulDescSetAttribute;
    __typeof__(cublasLtMatrixLayoutCreate) *cublasLtMatrixLayoutCreate;
    __typeof__(cublasLtMatrixLayoutDestroy) *cublasLtMatrixLayoutDestroy;
    __typeof__(cublasLtMatmulPreferenceCreate) *cublasLtMatmulPreferenceCreate;
    __typeof__(cublasLtMatmulPreferenceDestroy) *cublasLtMatmulPreferenceDestroy;
    __typeof__(cublasLtMatmulPreferenceSetAttribute) *cublasLtMatmulPreferenceSetAttribute;
    __typeof__(cublasLtMatmulAlgoGetHeuristic) *cublasLtMatmulAlgoGetHeuristic;
    __typeof__(cublasLtMatmul) *cublasLtMatmul;
} zr_cudalib_cublaslt;

/* Open cuBLASLt (libcublasLt.so.<cuBLAS major>) on the first call; *out: its table. */
zr_status zr_cudalib_load_cublaslt(const zr_cudalib_cublaslt **out);

#if ZR_NCCL
#include <nccl.h>

/* The NCCL functions zr calls (transport_nccl.c, and the baselines of bench_comm_cuda.c). */
typedef struct zr_cudalib_nccl {
    __typeof__(ncclGetVersion) *ncclGetVersion;
    __typeof__(ncclGetErrorString) *ncclGetErrorString;
    __typeof__(ncclGetUniqueId) *ncclGetUniqueId;
    __typeof__(ncclCommInitRank) *ncclCommInitRank;
    __typeof__(ncclCommSplit) *ncclCommSplit;
    __typeof__(ncclCommDestroy) *ncclCommDestroy;
    __typeof__(ncclCommAbort) *ncclCommAbort;
    __typeof__(ncclCommGetAsyncError) *ncclCommGetAsyncError;
    __typeof__(ncclCommCount) *ncclCommCount;
    __typeof__(ncclCommUserRank) *ncclCommUserRank;
    __typeof__(ncclGroupStart) *ncclGroupStart;
    __typeof__(ncclGroupEnd) *ncclGroupEnd;
    __typeof__(ncclSend) *ncclSend;
    __typeof__(ncclRecv) *ncclRecv;
    __typeof__(ncclAllGather) *ncclAllGather;
    __typeof__(ncclReduceScatter) *ncclReduceScatter;
} zr_cudalib_nccl;

/* Open NCCL on the first call; *out: its table. */
zr_status zr_cudalib_load_nccl(const zr_cudalib_nccl **out);
#endif /* ZR_NCCL */

#endif /* ZR_CUDA */

#endif /* ZR_CUDALIB_H */
