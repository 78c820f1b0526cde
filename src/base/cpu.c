/*
 * cpu.c - what the CPU can do (blas.h): its features from cpuid and xgetbv,
 * the cores of the process's affinity mask, and its fused multiply-add peak.
 *
 * The peak is a loop of independent a = a * b + c on registers only: 16
 * sums of 16 floats with AVX-512 (32 registers; two FMA units of 4 cycles'
 * latency need 8 in flight), 12 of 8 with AVX2 (16 registers), 12 of 4
 * with SSE2 multiply + add. The sums converge to c / (1 - b), so nothing
 * overflows or turns subnormal. Threads start together (a flag they wait on); the
 * rate is every thread's work over the time from the first start to the
 * last end, or the sum of each thread's work over the CPU time it got.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */

#include "blas.h"

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- features ------------------------------------------------------------------- */

static unsigned long long xcr0(void)
{
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

void zr_cpu_features_get(zr_cpu_features *out)
{
    memset(out, 0, sizeof *out);
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) {
        return;
    }
    unsigned top = a;
    char vendor[13] = {0};
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    out->vendor = strcmp(vendor, "GenuineIntel") == 0 ? ZR_CPU_VENDOR_INTEL
                  : strcmp(vendor, "AuthenticAMD") == 0 || strcmp(vendor, "HygonGenuine") == 0
                      ? ZR_CPU_VENDOR_AMD
                      : ZR_CPU_VENDOR_OTHER;
    __get_cpuid(1, &a, &b, &c, &d);
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
    unsigned long long x = osxsave ? xcr0() : 0;
    out->avx = avx && (x & 0x6) == 0x6;
    if (top < 7 || !out->avx) {
        return;
    }
    __cpuid_count(7, 0, a, b, c, d);
    unsigned sub = a;
    int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1,
        vl = (b >> 31) & 1, amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    out->avx2_fma = avx2 && fma;
    out->avx512 = out->avx2_fma && f && dq && bw && vl && (x & 0xe0) == 0xe0;
    out->amx = amx_bf16 && amx_tile && (x & 0x60000) == 0x60000;
    if (sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        out->avx512_bf16 = out->avx512 && ((a >> 5) & 1);
    }
    zr_cpu_level cap = zr_cpu_cap();
    if (cap < ZR_CPU_AVX512) {
        out->avx512 = out->avx512_bf16 = out->amx = 0;
    }
    if (cap < ZR_CPU_AVX2) {
        out->avx = out->avx2_fma = 0;
    }
}

const char *zr_cpu_features_str(const zr_cpu_features *f, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s%s",
             f->avx512     ? "avx512"
             : f->avx2_fma ? "avx2+fma"
             : f->avx      ? "avx"
                           : "sse2",
             f->avx512_bf16 ? " avx512_bf16" : "", f->amx ? " amx" : "");
    return buf;
}

/* ---- cores ---------------------------------------------------------------------- */

int zr_cpu_cores(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) {
        return CPU_COUNT(&set);
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int env_set(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0';
}

const char *zr_cpu_cores_advice(int cores, int threads, char *buf, size_t n)
{
    buf[0] = '\0';
    if (cores >= threads) {
        return buf;
    }
    if (env_set("OMPI_COMM_WORLD_SIZE")) {
        snprintf(buf, n,
                 "Open MPI binds each rank to a core by default: give mpirun --map-by slot:PE=%d "
                 "(%d cores per rank) or --bind-to none",
                 threads, threads);
    } else if (env_set("SLURM_JOB_ID") || env_set("SLURM_PROCID")) {
        snprintf(buf, n, "ask Slurm for the cores: srun --cpus-per-task=%d (or #SBATCH -c %d)",
                 threads, threads);
    } else if (env_set("PMI_RANK")) {
        snprintf(buf, n, "give mpiexec -bind-to core:%d, or -bind-to none", threads);
    } else {
        snprintf(buf, n,
                 "widen the process's CPU set (taskset, numactl, the cgroup), or give "
                 "--threads %d",
                 cores);
    }
    return buf;
}

/* ---- the FMA peak ----------------------------------------------------------------- */

#define ACC512 16
#define ACC256 12
#define ACC128 12

/* Each returns the flops of iters iterations; *sink keeps the sums alive. */
__attribute__((target("avx512f"))) static double loop_avx512(long iters, float *sink)
{
    __m512 acc[ACC512];
    for (int k = 0; k < ACC512; k++) {
        acc[k] = _mm512_set1_ps(1e-3f * (float)k);
    }
    const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    for (long i = 0; i < iters; i++) {
        for (int k = 0; k < ACC512; k++) {
            acc[k] = _mm512_fmadd_ps(acc[k], b, c);
        }
    }
    __m512 s = acc[0];
    for (int k = 1; k < ACC512; k++) {
        s = _mm512_add_ps(s, acc[k]);
    }
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * ACC512 * 16 * 2;
}

__attribute__((target("avx2,fma"))) static double loop_avx2(long iters, float *sink)
{
    __m256 acc[ACC256];
    for (int k = 0; k < ACC256; k++) {
        acc[k] = _mm256_set1_ps(1e-3f * (float)k);
    }
    const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (long i = 0; i < iters; i++) {
        for (int k = 0; k < ACC256; k++) {
            acc[k] = _mm256_fmadd_ps(acc[k], b, c);
        }
    }
    float out[8];
    __m256 s = acc[0];
    for (int k = 1; k < ACC256; k++) {
        s = _mm256_add_ps(s, acc[k]);
    }
    _mm256_storeu_ps(out, s);
    *sink = out[0];
    return (double)iters * ACC256 * 8 * 2;
}

static double loop_sse2(long iters, float *sink)
{
    __m128 acc[ACC128];
    for (int k = 0; k < ACC128; k++) {
        acc[k] = _mm_set1_ps(1e-3f * (float)k);
    }
    const __m128 b = _mm_set1_ps(0.999f), c = _mm_set1_ps(1e-3f);
    for (long i = 0; i < iters; i++) {
        for (int k = 0; k < ACC128; k++) {
            acc[k] = _mm_add_ps(_mm_mul_ps(acc[k], b), c);
        }
    }
    float out[4];
    _mm_storeu_ps(out, acc[0]);
    *sink = out[0];
    return (double)iters * ACC128 * 4 * 2;
}

typedef double (*peak_loop)(long iters, float *sink);

typedef struct peak_job {
    peak_loop loop;
    long iters;
    atomic_int *go;            /* the threads start together when it turns 1 */
    double t0, t1, flops, cpu; /* cpu: the thread's CPU time in the loop */
    float sink;
} peak_job;

static void *peak_thread(void *arg)
{
    peak_job *j = arg;
    while (atomic_load(j->go) == 0) {
        sched_yield();
    }
    j->t0 = zr_now();
    double c0 = zr_cpu_thread_time();
    j->flops = j->loop(j->iters, &j->sink);
    j->cpu = zr_cpu_thread_time() - c0;
    j->t1 = zr_now();
    return NULL;
}

/* The widest loop this CPU (capped by ZR_CPU) runs. */
static peak_loop pick_loop(const char **isa)
{
    zr_cpu_features f;
    zr_cpu_features_get(&f);
    /* the loop needs only AVX-512F; zr_cpu_features' avx512 asks for Skylake-X's whole set */
    if (zr_cpu_cap() >= ZR_CPU_AVX512 && __builtin_cpu_supports("avx512f")) {
        *isa = "avx512 fma";
        return loop_avx512;
    }
    if (f.avx2_fma) {
        *isa = "avx2 fma";
        return loop_avx2;
    }
    *isa = "sse2 mul+add";
    return loop_sse2;
}

double zr_cpu_thread_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double zr_cpu_fma_peak(int threads, double seconds, int on_cpu, const char **isa)
{
    const char *name = NULL;
    peak_loop loop = pick_loop(&name);
    if (isa != NULL) {
        *isa = name;
    }
    threads = threads < 1 ? 1 : threads > 256 ? 256 : threads;
    seconds = seconds < 0.01 ? 0.01 : seconds > 10 ? 10 : seconds;
    /* calibrate on one thread: iterations for `seconds` */
    float sink = 0;
    long iters = 1 << 14;
    double t = 0;
    for (;;) {
        double t0 = zr_now();
        loop(iters, &sink);
        t = zr_now() - t0;
        if (t >= 2e-3 || iters >= (1L << 40)) {
            break;
        }
        iters *= 4;
    }
    iters = (long)((double)iters * seconds / (t > 0 ? t : 1e-9)) + 1;
    peak_job jobs[256];
    pthread_t tid[256];
    atomic_int go = 0;
    jobs[0] = (peak_job){.loop = loop, .iters = iters, .go = &go};
    int started = 1; /* a thread that cannot start is left out of the count */
    for (int i = 1; i < threads; i++) {
        jobs[started] = jobs[0];
        if (pthread_create(&tid[started], NULL, peak_thread, &jobs[started]) == 0) {
            started++;
        }
    }
    atomic_store(&go, 1);
    peak_thread(&jobs[0]);
    double first = jobs[0].t0, last = jobs[0].t1, flops = jobs[0].flops;
    double on = jobs[0].flops / jobs[0].cpu; /* the sum of each thread's rate on its CPU */
    for (int i = 1; i < started; i++) {
        pthread_join(tid[i], NULL);
        first = jobs[i].t0 < first ? jobs[i].t0 : first;
        last = jobs[i].t1 > last ? jobs[i].t1 : last;
        flops += jobs[i].flops;
        on += jobs[i].flops / jobs[i].cpu;
    }
    return (on_cpu ? on : flops / (last - first)) * 1e-9;
}
