/*
 * blas.h - the CPU's BLAS (OpenBLAS), opened by zr after choosing its
 * kernels, and what the CPU can do: its features (cpuid), its cores (the
 * affinity mask) and its fused multiply-add peak.
 *
 * Why opened and not linked: OpenBLAS built for many CPUs (DYNAMIC_ARCH, as
 * Debian's) picks its kernels once, when the library is loaded, from the
 * CPU's model number, and falls back to its oldest x86-64 kernels
 * (Prescott, SSE3) for a model it does not know: every CPU newer than the
 * library, and the cloud VMs that hide their model ("Intel(R) Xeon(R)
 * Processor", an AVX-512 CPU with AVX512_BF16 and AMX, ran sgemm at 18-20
 * GFLOP/s a core, 2.5-3x slower than with the right kernels). Its only
 * control is OPENBLAS_CORETYPE, read at that load. A program linked to it
 * loads it before main; so zr is not linked to it but opens it here: once
 * by itself to ask which kernels it chose (openblas_get_corename), and
 * where they are weaker than the CPU's features allow, closed and opened
 * again with OPENBLAS_CORETYPE set to the right ones (zr_blas_choose), the
 * environment then put back as it was. Nothing outside the process is
 * involved, so it works the same on every rank under any launcher (mpirun,
 * srun), and no re-exec is needed. zr's `main` opens it before MPI starts
 * its threads (setenv is not thread-safe); a library user gets it at the
 * first zr_gpt_init, or calls zr_blas_load first.
 *
 * A user's own OPENBLAS_CORETYPE wins (nothing is probed or changed), and
 * so does an OpenBLAS built for one CPU (no DYNAMIC_ARCH in its
 * openblas_get_config), which ignores the variable. ZR_CPU (zr_cpu_cap)
 * caps the features here as it caps zr's own kernels: ZR_CPU=avx2 runs
 * OpenBLAS's Haswell (Zen on AMD) kernels even on an AVX-512 CPU.
 *
 * Where from: ZR_BLAS_LIB=file when set (any library with cblas_sgemm; the
 * openblas_* functions are used when it has them); otherwise
 * libopenblas.so.0 by soname (the loader's search, so Debian's alternatives
 * and LD_LIBRARY_PATH choose as they would for a linked program), then from
 * the folder the build found it in (ZR_BLAS_DIR, pkg-config's libdir). A
 * process that already has it loaded (a program linked to it, the GPU
 * emulator's) keeps the kernels it chose at start-up, and the report says so.
 */
#ifndef ZR_BLAS_H
#define ZR_BLAS_H

#include "zr/base.h"

#include <cblas.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the CPU -------------------------------------------------------------------- */

typedef enum { ZR_CPU_VENDOR_OTHER = 0, ZR_CPU_VENDOR_INTEL, ZR_CPU_VENDOR_AMD } zr_cpu_vendor;

/* What the CPU and the operating system let a process run (cpuid and xgetbv). */
typedef struct zr_cpu_features {
    zr_cpu_vendor vendor;
    int avx;         /* AVX with the OS saving ymm */
    int avx2_fma;    /* AVX2 and FMA3 */
    int avx512;      /* AVX-512 F, BW, VL and DQ (Skylake-X's set) with zmm state */
    int avx512_bf16; /* AVX512_BF16 on top of avx512 */
    int amx;         /* AMX-BF16 with the tile state enabled by the OS */
} zr_cpu_features;

/* This CPU's features, capped by ZR_CPU (zr_cpu_cap) as zr's kernels are. */
void zr_cpu_features_get(zr_cpu_features *out);
/* "avx512 avx512_bf16 amx" (the usable ones, widest first; "sse2" for none); returns buf. */
const char *zr_cpu_features_str(const zr_cpu_features *f, char *buf, size_t n);

/* The cores this process may run on (its affinity mask); at least 1. */
int zr_cpu_cores(void);
/*
 * Writes to buf what makes a process of `cores` cores run `threads` threads on as many
 * cores, for the launcher that started it (by its environment: Open MPI, Slurm,
 * MPICH/Hydra, or none); "" when cores >= threads. Returns buf.
 */
const char *zr_cpu_cores_advice(int cores, int threads, char *buf, size_t n);

/*
 * The fused multiply-add peak of `threads` threads (1..256) running at once, in GFLOP/s:
 * a loop of the widest FMAs the CPU has (AVX-512, AVX2+FMA; SSE2 multiply + add
 * otherwise), on registers only, with enough independent sums to hide their latency.
 * Runs about `seconds` (0.01-10); *isa: the instructions it used. on_cpu: per second of
 * CPU time each thread got (CLOCK_THREAD_CPUTIME_ID), so that the time slices a busy
 * machine gives to others are left out; else per second of wall time.
 */
double zr_cpu_fma_peak(int threads, double seconds, int on_cpu, const char **isa);
/* The calling thread's CPU time, in seconds. */
double zr_cpu_thread_time(void);

/* ---- the BLAS ------------------------------------------------------------------- */

/* The BLAS functions zr calls, and how the library was opened. */
typedef struct zr_blas {
    __typeof__(cblas_sgemm) *cblas_sgemm;
    /* OpenBLAS's own; NULL in a library without them */
    __typeof__(openblas_set_num_threads) *openblas_set_num_threads;
    __typeof__(openblas_get_corename) *openblas_get_corename;
    __typeof__(openblas_get_config) *openblas_get_config;
    char path[512];     /* the file */
    char core[64];      /* the kernels it runs (openblas_get_corename), "unknown" */
    char reported[64];  /* the kernels it chose by itself; "" when not asked */
    char how[256];      /* why these: "chosen by OpenBLAS", "set by zr: ...", "the user's ..." */
    char features[128]; /* zr_cpu_features_str of the CPU */
} zr_blas;

/*
 * The OpenBLAS kernels (its core name, as OPENBLAS_CORETYPE takes it) a process should
 * run, or NULL to leave the library's own choice. f: the CPU's features (capped by
 * ZR_CPU when capped != 0, which may then lower a core too); reported: the core the
 * library chose by itself (any case); user: OPENBLAS_CORETYPE as the user set it, or
 * NULL; dynamic: whether the library was built for many CPUs (DYNAMIC_ARCH). A core
 * zr does not know (a newer library's) is left alone. why: the reason, in words.
 * Depends on nothing else (the tests give it made-up CPUs).
 */
const char *zr_blas_choose(const zr_cpu_features *f, const char *reported, const char *user,
                           int capped, int dynamic, char *why, size_t n);
/* The best core for f (Cooperlake, SkylakeX, Haswell or Zen, Sandybridge, Prescott). */
const char *zr_blas_core_for(const zr_cpu_features *f);
/* How wide a core's kernels are: 0 (SSE) .. 4 (AVX-512 BF16); -1 for a core zr does not know. */
int zr_blas_core_level(const char *core);

/*
 * Opens the BLAS on the first call (as above) and says so at ZR_DEBUG=info; *out: its
 * table. A failure (no library, a function missing) is ZR_ERR_IO naming each file tried
 * and the loader's words, kept and returned by every later call. Thread-safe.
 */
zr_status zr_blas_load(const zr_blas **out);
/* The table; the first call loads it and ends the process with the message if it cannot. */
const zr_blas *zr_blas_get(void);
/* OpenBLAS's own threads (no-op in a library without openblas_set_num_threads). */
void zr_blas_set_threads(int threads);

/*
 * GFLOP/s of a single n^3 sgemm, the median of reps (after one to warm up); -1 on no memory.
 * on_cpu: per second of the calling thread's CPU time (meaningful with the BLAS on one
 * thread, zr_blas_set_threads(1), where the product runs on the caller).
 */
double zr_blas_sgemm_rate(int n, int reps, int on_cpu);

/* ---- bf16 products (blas_bf16.c) ------------------------------------------------- */

/*
 * Whether matrix products should take bf16 inputs (fp32 accumulation and output) on this
 * CPU: where it has AMX-BF16 or AVX512_BF16 (f, capped by ZR_CPU), not elsewhere.
 * setting: ZR_CPU_BF16 as the user set it, or NULL: "0"/"off" never, "1"/"on" as the CPU
 * allows, "force" whatever the CPU has (oneDNN then runs its slower kernels: for tests on
 * any x86-64). why: the reason, in words. Depends on nothing else.
 */
int zr_blas_bf16_choose(const zr_cpu_features *f, const char *setting, char *why, size_t n);
/*
 * This process's answer: zr_blas_bf16_choose on this CPU's features and ZR_CPU_BF16, then,
 * where chosen, zr_blas_bf16_load. 1: bf16 products, *kernel the implementation and why
 * the CPU's reason; 0: fp32, why says why ("fp32 products: " and the loader's words when
 * the library would not open; the error is cleared). The one place callers decide.
 */
int zr_blas_bf16_here(const char **kernel, char *why, size_t n);

/* A calling thread's state for zr_blas_gemm_bf16 (zeroed to start). */
typedef struct zr_blas_bf16_ctx {
    void *stream; /* oneDNN's stream */
    void *pad;    /* the products' scratchpad */
    size_t pad_bytes;
} zr_blas_bf16_ctx;

/*
 * Opens oneDNN 2 (libdnnl.so.2, or ZR_DNNL_LIB=file) on the first call; *kernel: the
 * implementation it runs a bf16 product with ("oneDNN brg:avx512_core_amx_bf16"). Fails
 * (ZR_ERR_IO, every later call too) naming the library and the loader's words when it
 * cannot. It does not consult zr_blas_bf16_choose: callers decide first. Thread-safe.
 */
zr_status zr_blas_bf16_load(const char **kernel);
/*
 * C[M x N] = op(A) op(B) + beta C, row-major, A and B bf16, C fp32, beta 0 or 1, on the
 * calling thread only; ctx: that thread's. The same shape gives the same bits every call.
 */
zr_status zr_blas_gemm_bf16(zr_blas_bf16_ctx *ctx, int ta, int tb, int M, int N, int K,
                            const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                            float *C, int ldc);
void zr_blas_bf16_ctx_free(zr_blas_bf16_ctx *ctx);

#endif /* ZR_BLAS_H */
