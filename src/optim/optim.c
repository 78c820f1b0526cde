/*
 * optim.c - AdamW, clipping and norm helpers, with run-time dispatch.
 *
 * The AdamW update is one pass over (param, grad, m, v). On x86-64 it has
 * SSE2 (baseline), AVX2 and AVX-512 kernels written with intrinsics and
 * target attributes, so a portable build runs the widest one the CPU has and
 * a -march=native binary is not needed for speed (nor able to die with
 * SIGILL on an older node). The choice is made at first use with
 * __builtin_cpu_supports, like the quantization kernels (quant_x86.c).
 *
 * Every kernel performs the scalar code's IEEE operations in the same order,
 * one instruction per operation: multiply, add, divide and square root are
 * correctly rounded in every width, and -ffp-contract=off keeps the compiler
 * from fusing a multiply and an add in any of them, so all paths give the
 * same bits (test_optim checks every path this CPU can run against the
 * scalar one). Every element is independent, so any sharding of a range
 * gives bit-identical results too. The scalar kernel is the reference and
 * the fallback on other CPUs; it uses sqrtf, which gcc will not vectorize
 * while errno semantics are on (zr does not build with -ffast-math).
 *
 * zr_sumsq's order is fixed by its eight double lanes, whatever the vector
 * width; it gets the same three instantiations.
 *
 * Threads: zr_adamw_update splits a long range over the process's pool
 * (zr/pool.h) in blocks of ZR_ADAM_BLOCK elements; elements are independent
 * and every kernel gives the scalar bits, so the split changes nothing.
 * zr_sumsq stays on one thread: splitting its sum would change its order.
 *
 * zr_sumsq_cuda_order is the CPU twin of the CUDA kernel's order of addition
 * (sumsq_rules.h) that tests check the GPU's sum against: plain C, in every
 * build.
 */
#include "zr/optim.h"

#include "adamw_rules.h" /* the element update, shared with the CUDA kernel */
#include "sumsq_rules.h" /* the CUDA sum's order, for zr_sumsq_cuda_order */
#include "zr/pool.h"

#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define ZR_OPTIM_X86 1
#include <immintrin.h>
#define T512 __attribute__((target("avx512f")))
#define T256 __attribute__((target("avx2")))
#else
#define ZR_OPTIM_X86 0
#endif

#define ALWAYS_INLINE inline __attribute__((always_inline))

zr_adamw zr_adamw_default(void)
{
    zr_adamw h = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    return h;
}

typedef zr_adamw_k adam_k;

typedef void (*adam_fn)(const adam_k *k, float *restrict p, const float *restrict g,
                        float *restrict m, float *restrict v, size_t n);
typedef double (*sumsq_fn)(const float *x, size_t n);

/* The reference (adamw_rules.h): the vector kernels below repeat its operations lane by lane. */
static void adam_scalar(const adam_k *k, float *restrict p, const float *restrict g,
                        float *restrict m, float *restrict v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        zr_adamw_elem(k, &p[i], g[i], &m[i], &v[i]);
    }
}

#if ZR_OPTIM_X86

/* SSE2 is part of x86-64, so this kernel needs no attribute and always runs. */
static void adam_sse2(const adam_k *k, float *restrict p, const float *restrict g,
                      float *restrict m, float *restrict v, size_t n)
{
    const __m128 gs = _mm_set1_ps(k->gs), b1 = _mm_set1_ps(k->b1), nb1 = _mm_set1_ps(k->nb1);
    const __m128 b2 = _mm_set1_ps(k->b2), nb2 = _mm_set1_ps(k->nb2), c1 = _mm_set1_ps(k->c1);
    const __m128 c2 = _mm_set1_ps(k->c2), eps = _mm_set1_ps(k->eps), wd = _mm_set1_ps(k->wd);
    const __m128 lr = _mm_set1_ps(k->lr);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 gi = _mm_mul_ps(_mm_loadu_ps(g + i), gs);
        __m128 mi = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(m + i)), _mm_mul_ps(nb1, gi));
        __m128 vi =
            _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(v + i)), _mm_mul_ps(nb2, _mm_mul_ps(gi, gi)));
        __m128 den = _mm_sqrt_ps(_mm_mul_ps(vi, c2));
        __m128 pi = _mm_loadu_ps(p + i);
        __m128 upd =
            _mm_add_ps(_mm_div_ps(_mm_mul_ps(mi, c1), _mm_add_ps(den, eps)), _mm_mul_ps(wd, pi));
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
        _mm_storeu_ps(p + i, _mm_sub_ps(pi, _mm_mul_ps(lr, upd)));
    }
    adam_scalar(k, p + i, g + i, m + i, v + i, n - i);
}

static T256 void adam_avx2(const adam_k *k, float *restrict p, const float *restrict g,
                           float *restrict m, float *restrict v, size_t n)
{
    const __m256 gs = _mm256_set1_ps(k->gs), b1 = _mm256_set1_ps(k->b1);
    const __m256 nb1 = _mm256_set1_ps(k->nb1), b2 = _mm256_set1_ps(k->b2);
    const __m256 nb2 = _mm256_set1_ps(k->nb2), c1 = _mm256_set1_ps(k->c1);
    const __m256 c2 = _mm256_set1_ps(k->c2), eps = _mm256_set1_ps(k->eps);
    const __m256 wd = _mm256_set1_ps(k->wd), lr = _mm256_set1_ps(k->lr);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
        __m256 mi =
            _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(nb1, gi));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                  _mm256_mul_ps(nb2, _mm256_mul_ps(gi, gi)));
        __m256 den = _mm256_sqrt_ps(_mm256_mul_ps(vi, c2));
        __m256 pi = _mm256_loadu_ps(p + i);
        __m256 upd = _mm256_add_ps(_mm256_div_ps(_mm256_mul_ps(mi, c1), _mm256_add_ps(den, eps)),
                                   _mm256_mul_ps(wd, pi));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(lr, upd)));
    }
    adam_scalar(k, p + i, g + i, m + i, v + i, n - i);
}

static T512 void adam_avx512(const adam_k *k, float *restrict p, const float *restrict g,
                             float *restrict m, float *restrict v, size_t n)
{
    const __m512 gs = _mm512_set1_ps(k->gs), b1 = _mm512_set1_ps(k->b1);
    const __m512 nb1 = _mm512_set1_ps(k->nb1), b2 = _mm512_set1_ps(k->b2);
    const __m512 nb2 = _mm512_set1_ps(k->nb2), c1 = _mm512_set1_ps(k->c1);
    const __m512 c2 = _mm512_set1_ps(k->c2), eps = _mm512_set1_ps(k->eps);
    const __m512 wd = _mm512_set1_ps(k->wd), lr = _mm512_set1_ps(k->lr);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), gs);
        __m512 mi =
            _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(nb1, gi));
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                  _mm512_mul_ps(nb2, _mm512_mul_ps(gi, gi)));
        __m512 den = _mm512_sqrt_ps(_mm512_mul_ps(vi, c2));
        __m512 pi = _mm512_loadu_ps(p + i);
        __m512 upd = _mm512_add_ps(_mm512_div_ps(_mm512_mul_ps(mi, c1), _mm512_add_ps(den, eps)),
                                   _mm512_mul_ps(wd, pi));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_mul_ps(lr, upd)));
    }
    adam_scalar(k, p + i, g + i, m + i, v + i, n - i);
}

#endif /* ZR_OPTIM_X86 */

/* 8 double lanes: vectorizes at any width, and the order depends only on n */
static ALWAYS_INLINE double sumsq_body(const float *x, size_t n)
{
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; k++) {
            double d = x[i + k];
            acc[k] += d * d;
        }
    }
    for (int k = 0; i < n; i++, k++) {
        double d = x[i];
        acc[k] += d * d;
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static double sumsq_scalar(const float *x, size_t n)
{
    return sumsq_body(x, n);
}

#if ZR_OPTIM_X86
static T256 double sumsq_avx2(const float *x, size_t n)
{
    return sumsq_body(x, n);
}

static T512 double sumsq_avx512(const float *x, size_t n)
{
    return sumsq_body(x, n);
}
#endif

/* ---- implementation selection ------------------------------------------- */

typedef struct optim_kernels {
    zr_optim_impl impl;
    adam_fn adam;
    sumsq_fn sumsq;
} optim_kernels;

static const optim_kernels k_scalar = {ZR_OPTIM_IMPL_SCALAR, adam_scalar, sumsq_scalar};
#if ZR_OPTIM_X86
/* sumsq has no separate SSE2 body: the plain one is already compiled for SSE2 */
static const optim_kernels k_sse2 = {ZR_OPTIM_IMPL_SSE2, adam_sse2, sumsq_scalar};
static const optim_kernels k_avx2 = {ZR_OPTIM_IMPL_AVX2, adam_avx2, sumsq_avx2};
static const optim_kernels k_avx512 = {ZR_OPTIM_IMPL_AVX512, adam_avx512, sumsq_avx512};
#endif

/* NULL when this CPU cannot run impl; AUTO is the widest it can. */
static const optim_kernels *kernels_of(zr_optim_impl impl)
{
#if ZR_OPTIM_X86
    __builtin_cpu_init();
    int avx2 = zr_cpu_cap() >= ZR_CPU_AVX2 && __builtin_cpu_supports("avx2");
    int avx512 = zr_cpu_cap() >= ZR_CPU_AVX512 && __builtin_cpu_supports("avx512f");
    switch (impl) {
    case ZR_OPTIM_IMPL_AUTO:
        return avx512 ? &k_avx512 : avx2 ? &k_avx2 : &k_sse2;
    case ZR_OPTIM_IMPL_SCALAR:
        return &k_scalar;
    case ZR_OPTIM_IMPL_SSE2:
        return &k_sse2;
    case ZR_OPTIM_IMPL_AVX2:
        return avx2 ? &k_avx2 : NULL;
    case ZR_OPTIM_IMPL_AVX512:
        return avx512 ? &k_avx512 : NULL;
    }
    return NULL;
#else
    return impl == ZR_OPTIM_IMPL_AUTO || impl == ZR_OPTIM_IMPL_SCALAR ? &k_scalar : NULL;
#endif
}

/* chosen at first use; zr_optim_set_impl replaces it */
static const optim_kernels *active;

static const optim_kernels *kernels(void)
{
    if (active == NULL) {
        active = kernels_of(ZR_OPTIM_IMPL_AUTO);
        ZR_ASSERT(active != NULL); /* scalar is always there */
    }
    return active;
}

zr_status zr_optim_set_impl(zr_optim_impl impl)
{
    if (impl < ZR_OPTIM_IMPL_AUTO || impl > ZR_OPTIM_IMPL_AVX512) {
        ZR_FAIL(ZR_ERR_INVALID, "optim impl: unknown implementation %d", (int)impl);
    }
    const optim_kernels *k = kernels_of(impl);
    if (k == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "optim impl: this CPU cannot run %s%s", zr_optim_impl_name(impl),
                zr_cpu_cap() < ZR_CPU_AVX512 ? " (ZR_CPU caps the kernels)" : "");
    }
    active = k;
    return ZR_OK;
}

zr_optim_impl zr_optim_get_impl(void)
{
    return kernels()->impl;
}

const char *zr_optim_impl_name(zr_optim_impl impl)
{
    switch (impl) {
    case ZR_OPTIM_IMPL_AUTO:
        return "auto";
    case ZR_OPTIM_IMPL_SCALAR:
        return "scalar";
    case ZR_OPTIM_IMPL_SSE2:
        return "sse2";
    case ZR_OPTIM_IMPL_AVX2:
        return "avx2";
    case ZR_OPTIM_IMPL_AVX512:
        return "avx512";
    }
    return "unknown";
}

/* ---- entry points ---------------------------------------------------------- */

/* Elements per block of a threaded update, and blocks a thread takes at least. */
#define ZR_ADAM_BLOCK 1024
#define ZR_ADAM_GRAIN 32

typedef struct adam_job {
    const adam_k *k;
    adam_fn fn;
    float *p, *m, *v;
    const float *g;
    size_t n;
} adam_job;

static void adam_task(void *arg, size_t b0, size_t b1, int thread)
{
    const adam_job *j = arg;
    (void)thread;
    size_t i0 = b0 * ZR_ADAM_BLOCK, i1 = b1 * ZR_ADAM_BLOCK < j->n ? b1 * ZR_ADAM_BLOCK : j->n;
    j->fn(j->k, j->p + i0, j->g + i0, j->m + i0, j->v + i0, i1 - i0);
}

void zr_adamw_update(const zr_adamw *h, float lr, int t, float grad_scale, int decay,
                     float *restrict param, const float *restrict grad, float *restrict m,
                     float *restrict v, size_t n)
{
    adam_k k =
        zr_adamw_consts(h->beta1, h->beta2, h->eps, h->weight_decay, lr, t, grad_scale, decay);
    adam_job j = {&k, kernels()->adam, param, m, v, grad, n};
    zr_parallel_for((n + ZR_ADAM_BLOCK - 1) / ZR_ADAM_BLOCK, ZR_ADAM_GRAIN, adam_task, &j);
}

float zr_clip_scale(double grad_norm, float max_norm)
{
    if (max_norm <= 0.0f) {
        return 1.0f;
    }
    double s = (double)max_norm / (grad_norm + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}

double zr_sumsq(const float *x, size_t n)
{
    return kernels()->sumsq(x, n);
}

double zr_sumsq_cuda_order(const float *x, size_t n)
{
    uint64_t parts = zr_sumsq_partials(n);
    uint64_t tiles = (n + ZR_SUMSQ_TILE - 1) / ZR_SUMSQ_TILE;
    static double part[ZR_SUMSQ_BLOCKS], s[ZR_SUMSQ_THREADS];
    for (uint64_t b = 0; b < parts; b++) {
        for (int i = 0; i < ZR_SUMSQ_THREADS; i++) {
            double acc = 0.0;
            for (uint64_t t = b; t < tiles; t += parts) {
                for (int j = 0; j < 4; j++) {
                    uint64_t e = t * ZR_SUMSQ_TILE + (uint64_t)j * 4 * ZR_SUMSQ_THREADS + 4u * i;
                    for (uint64_t k = e; k < e + 4 && k < n; k++) {
                        acc = zr_sumsq_add(acc, x[k]);
                    }
                }
            }
            s[i] = acc;
        }
        for (int h = ZR_SUMSQ_THREADS / 2; h > 0; h /= 2) {
            for (int i = 0; i < h; i++) {
                s[i] = s[i] + s[i + h];
            }
        }
        part[b] = s[0];
    }
    for (uint64_t b = parts; b < ZR_SUMSQ_BLOCKS; b++) {
        part[b] = 0.0;
    }
    for (int h = ZR_SUMSQ_BLOCKS / 2; h > 0; h /= 2) {
        for (int i = 0; i < h; i++) {
            part[i] = part[i] + part[i + h];
        }
    }
    return part[0];
}
