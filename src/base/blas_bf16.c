/*
 * blas_bf16.c - matrix products on bf16 inputs with fp32 accumulation on the
 * CPU, through oneDNN's matmul (blas.h says when and why).
 *
 * Why oneDNN: OpenBLAS 0.3.21 (Debian 12's) is built without its bf16
 * product (no sbgemm in the library), and the CPUs that have bf16 products
 * have them as AVX512_BF16's dot products or AMX's tiles, which only a
 * library with run-time code generation reaches at their rate: oneDNN 2.6
 * (Debian's libdnnl2) runs its brgemm kernels on AMX tiles
 * ("brg:avx512_core_amx_bf16") or on AVX512_BF16 ("brg:avx512_core_bf16"),
 * 3-4x OpenBLAS's best fp32 kernels on one core of the project's Sapphire
 * Rapids VM. Like OpenBLAS it is opened, not linked: on first use, and only
 * where the products are asked for, so that zr runs without it.
 *
 * One call computes on the calling thread only (oneDNN's OpenMP threads are
 * set to 1 on it): the model splits a product into bands of rows over zr's
 * own pool, as it does for OpenBLAS. Primitives are made once per shape and
 * kept (oneDNN's own cache would still parse a description every call);
 * each runs with the calling thread's scratchpad and stream (the user
 * scratchpad mode), which makes one primitive safe to run on several
 * threads at once.
 */
#define _POSIX_C_SOURCE 200809L

#include "blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the choice ----------------------------------------------------------------- */

int zr_blas_bf16_choose(const zr_cpu_features *f, const char *setting, char *why, size_t n)
{
    if (setting != NULL && (strcmp(setting, "0") == 0 || strcmp(setting, "off") == 0)) {
        snprintf(why, n, "ZR_CPU_BF16=%s: fp32 products", setting);
        return 0;
    }
    if (setting != NULL && strcmp(setting, "force") == 0) {
        snprintf(why, n, "ZR_CPU_BF16=force: bf16 products whatever the CPU has");
        return 1;
    }
    if (setting != NULL && setting[0] != '\0' && strcmp(setting, "1") != 0 &&
        strcmp(setting, "on") != 0) {
        snprintf(why, n, "ZR_CPU_BF16=%s is not one of 0, off, 1, on, force: fp32 products",
                 setting);
        return 0;
    }
    if (f->amx) {
        snprintf(why, n, "AMX-BF16 tiles");
        return 1;
    }
    if (f->avx512_bf16) {
        snprintf(why, n, "AVX512_BF16 dot products");
        return 1;
    }
    snprintf(why, n, "this CPU has neither AVX512_BF16 nor AMX-BF16%s: fp32 products",
             zr_cpu_cap() < ZR_CPU_AVX512 ? " (under ZR_CPU)" : "");
    return 0;
}

#if defined(__has_include)
#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#endif
#endif

#if defined(DNNL_VERSION_MAJOR) && DNNL_VERSION_MAJOR == 2

#define ZR_DNNL_SONAME "libdnnl.so.2"

/* The oneDNN functions used, looked up by name. */
#define ZR_DNNL_FUNCS(X)                                                                           \
    X(dnnl_engine_create)                                                                          \
    X(dnnl_stream_create)                                                                          \
    X(dnnl_stream_wait)                                                                            \
    X(dnnl_stream_destroy)                                                                         \
    X(dnnl_memory_desc_init_by_strides)                                                            \
    X(dnnl_memory_desc_get_size)                                                                   \
    X(dnnl_matmul_desc_init)                                                                       \
    X(dnnl_primitive_attr_create)                                                                  \
    X(dnnl_primitive_attr_destroy)                                                                 \
    X(dnnl_primitive_attr_set_scratchpad_mode)                                                     \
    X(dnnl_primitive_attr_set_post_ops)                                                            \
    X(dnnl_post_ops_create)                                                                        \
    X(dnnl_post_ops_append_sum)                                                                    \
    X(dnnl_post_ops_destroy)                                                                       \
    X(dnnl_primitive_desc_create)                                                                  \
    X(dnnl_primitive_desc_query)                                                                   \
    X(dnnl_primitive_desc_query_md)                                                                \
    X(dnnl_primitive_desc_destroy)                                                                 \
    X(dnnl_primitive_create)                                                                       \
    X(dnnl_primitive_execute)                                                                      \
    X(dnnl_primitive_destroy)                                                                      \
    X(dnnl_memory_create)                                                                          \
    X(dnnl_memory_destroy)

static struct {
#define ZR_DNNL_FIELD(name) __typeof__(name) *name;
    ZR_DNNL_FUNCS(ZR_DNNL_FIELD)
#undef ZR_DNNL_FIELD
    void (*omp_set_num_threads)(int); /* the OpenMP oneDNN runs on; NULL in other builds */
    dnnl_engine_t engine;
} dn;

/* One shape's primitive, kept. */
typedef struct plan {
    int ta, tb, M, N, K, lda, ldb, ldc, accumulate;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a, b, c, pad;
    size_t pad_bytes;
} plan;

#define ZR_BF16_PLANS 128

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;
static plan plans[ZR_BF16_PLANS];
static int nplans;
static int usable;
static char kernel[128];
static char load_msg[512];

/* Makes the primitive of p's shape (p->prim NULL on failure); impl: where its implementation's
 * name goes, or NULL. */
static dnnl_status_t plan_make(plan *p, char *impl, size_t n)
{
    dnnl_dims_t ad = {p->M, p->K}, as = {p->ta ? 1 : p->lda, p->ta ? p->lda : 1};
    dnnl_dims_t bd = {p->K, p->N}, bs = {p->tb ? 1 : p->ldb, p->tb ? p->ldb : 1};
    dnnl_dims_t cd = {p->M, p->N}, cs = {p->ldc, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s;
    p->prim = NULL;
    if ((s = dn.dnnl_memory_desc_init_by_strides(&p->a, 2, ad, dnnl_bf16, as)) != dnnl_success ||
        (s = dn.dnnl_memory_desc_init_by_strides(&p->b, 2, bd, dnnl_bf16, bs)) != dnnl_success ||
        (s = dn.dnnl_memory_desc_init_by_strides(&p->c, 2, cd, dnnl_f32, cs)) != dnnl_success ||
        (s = dn.dnnl_matmul_desc_init(&md, &p->a, &p->b, NULL, &p->c)) != dnnl_success ||
        (s = dn.dnnl_primitive_attr_create(&attr)) != dnnl_success ||
        (s = dn.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) !=
            dnnl_success) {
        goto done;
    }
    if (p->accumulate) {
        if ((s = dn.dnnl_post_ops_create(&ops)) != dnnl_success ||
            (s = dn.dnnl_post_ops_append_sum(ops, 1.0f)) != dnnl_success ||
            (s = dn.dnnl_primitive_attr_set_post_ops(attr, ops)) != dnnl_success) {
            goto done;
        }
    }
    if ((s = dn.dnnl_primitive_desc_create(&pd, &md, attr, dn.engine, NULL)) != dnnl_success) {
        goto done;
    }
    const dnnl_memory_desc_t *pad =
        dn.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    p->pad = *pad;
    p->pad_bytes = dn.dnnl_memory_desc_get_size(pad);
    const char *name = NULL;
    if (impl != NULL &&
        dn.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success) {
        snprintf(impl, n, "%s", name);
    }
    s = dn.dnnl_primitive_create(&p->prim, pd);
done:
    if (pd != NULL) {
        dn.dnnl_primitive_desc_destroy(pd);
    }
    if (ops != NULL) {
        dn.dnnl_post_ops_destroy(ops);
    }
    if (attr != NULL) {
        dn.dnnl_primitive_attr_destroy(attr);
    }
    return s;
}

/* The implementation oneDNN picks for a bf16 product of a model's shape, in kernel. */
static int probe(void)
{
    plan p = {.ta = 0, .tb = 1, .M = 256, .N = 256, .K = 256, .lda = 256, .ldb = 256, .ldc = 256};
    char impl[96] = "";
    dnnl_status_t s = plan_make(&p, impl, sizeof impl);
    if (p.prim != NULL) {
        dn.dnnl_primitive_destroy(p.prim);
    }
    if (s != dnnl_success) {
        snprintf(load_msg, sizeof load_msg, "oneDNN has no bf16 matmul on this CPU (status %d)",
                 (int)s);
        return 0;
    }
    snprintf(kernel, sizeof kernel, "oneDNN %s", impl[0] != '\0' ? impl : "(unnamed)");
    return 1;
}

static void load_once(void)
{
    const char *env = getenv("ZR_DNNL_LIB");
    const char *file = env != NULL && env[0] != '\0' ? env : ZR_DNNL_SONAME;
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(load_msg, sizeof load_msg,
                 "oneDNN 2 could not be opened (%s; Debian's libdnnl2, or ZR_DNNL_LIB=file)",
                 e != NULL ? e : file);
        return;
    }
    void *sym;
#define ZR_DNNL_LOOKUP(name)                                                                       \
    if ((sym = dlsym(h, #name)) == NULL) {                                                         \
        snprintf(load_msg, sizeof load_msg, "%s lacks %s", file, #name);                           \
        return;                                                                                    \
    }                                                                                              \
    memcpy(&dn.name, &sym, sizeof sym);
    ZR_DNNL_FUNCS(ZR_DNNL_LOOKUP)
#undef ZR_DNNL_LOOKUP
    if ((sym = dlsym(h, "omp_set_num_threads")) != NULL) {
        memcpy(&dn.omp_set_num_threads, &sym, sizeof sym);
    }
    if (dn.dnnl_engine_create(&dn.engine, dnnl_cpu, 0) != dnnl_success) {
        snprintf(load_msg, sizeof load_msg, "oneDNN (%s) found no CPU engine", file);
        return;
    }
    usable = probe();
    if (usable) {
        ZR_INFO("bf16 products: %s (%s)", kernel, file);
    }
}

zr_status zr_blas_bf16_load(const char **kernel_out)
{
    *kernel_out = NULL;
    pthread_once(&once, load_once);
    if (!usable) {
        ZR_FAIL(ZR_ERR_IO, "%s", load_msg);
    }
    *kernel_out = kernel;
    return ZR_OK;
}

/* The kept plan of a shape, made on first use; NULL when the table is full. */
static const plan *plan_get(const plan *key, dnnl_status_t *s)
{
    const plan *found = NULL;
    *s = dnnl_success;
    pthread_mutex_lock(&plans_lock);
    for (int i = 0; i < nplans && found == NULL; i++) {
        const plan *p = &plans[i];
        if (p->ta == key->ta && p->tb == key->tb && p->M == key->M && p->N == key->N &&
            p->K == key->K && p->lda == key->lda && p->ldb == key->ldb && p->ldc == key->ldc &&
            p->accumulate == key->accumulate) {
            found = p;
        }
    }
    if (found == NULL && nplans < ZR_BF16_PLANS) {
        plan *p = &plans[nplans];
        *p = *key;
        if ((*s = plan_make(p, NULL, 0)) == dnnl_success) {
            found = &plans[nplans++];
        }
    }
    pthread_mutex_unlock(&plans_lock);
    return found;
}

/* Runs plan p on the calling thread with ctx's stream and scratchpad. */
static dnnl_status_t execute(const plan *p, zr_blas_bf16_ctx *ctx, const void *A, const void *B,
                             float *C)
{
    if (ctx->stream == NULL) {
        dnnl_stream_t st;
        dnnl_status_t s = dn.dnnl_stream_create(&st, dn.engine, dnnl_stream_default_flags);
        if (s != dnnl_success) {
            return s;
        }
        ctx->stream = st;
    }
    if (p->pad_bytes > ctx->pad_bytes) {
        void *pad = NULL;
        if (posix_memalign(&pad, 64, p->pad_bytes) != 0) {
            return dnnl_out_of_memory;
        }
        free(ctx->pad);
        ctx->pad = pad;
        ctx->pad_bytes = p->pad_bytes;
    }
    dnnl_memory_t m[4] = {NULL, NULL, NULL, NULL};
    dnnl_status_t s;
    if ((s = dn.dnnl_memory_create(&m[0], &p->a, dn.engine, (void *)(uintptr_t)A)) ==
            dnnl_success &&
        (s = dn.dnnl_memory_create(&m[1], &p->b, dn.engine, (void *)(uintptr_t)B)) ==
            dnnl_success &&
        (s = dn.dnnl_memory_create(&m[2], &p->c, dn.engine, C)) == dnnl_success &&
        (s = dn.dnnl_memory_create(&m[3], &p->pad, dn.engine, ctx->pad)) == dnnl_success) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m[0]},
                                   {DNNL_ARG_WEIGHTS, m[1]},
                                   {DNNL_ARG_DST, m[2]},
                                   {DNNL_ARG_SCRATCHPAD, m[3]}};
        if (dn.omp_set_num_threads != NULL) {
            dn.omp_set_num_threads(1); /* this thread's OpenMP setting: zr's pool splits */
        }
        s = dn.dnnl_primitive_execute(p->prim, (dnnl_stream_t)ctx->stream, 4, args);
        if (s == dnnl_success) {
            s = dn.dnnl_stream_wait((dnnl_stream_t)ctx->stream);
        }
    }
    for (int i = 0; i < 4; i++) {
        if (m[i] != NULL) {
            dn.dnnl_memory_destroy(m[i]);
        }
    }
    return s;
}

zr_status zr_blas_gemm_bf16(zr_blas_bf16_ctx *ctx, int ta, int tb, int M, int N, int K,
                            const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                            float *C, int ldc)
{
    const char *k;
    ZR_CHECK(zr_blas_bf16_load(&k));
    if (M <= 0 || N <= 0 || K <= 0 || (beta != 0.0f && beta != 1.0f) || lda < (ta ? M : K) ||
        ldb < (tb ? K : N) || ldc < N) {
        ZR_FAIL(ZR_ERR_INVALID,
                "bf16 product %d x %d x %d (ta %d, tb %d, lda %d, ldb %d, ldc %d, beta %g): "
                "need positive sizes, leading dimensions at least the rows and beta 0 or 1",
                M, N, K, ta, tb, lda, ldb, ldc, (double)beta);
    }
    plan key = {.ta = ta != 0,
                .tb = tb != 0,
                .M = M,
                .N = N,
                .K = K,
                .lda = lda,
                .ldb = ldb,
                .ldc = ldc,
                .accumulate = beta != 0.0f};
    dnnl_status_t s;
    const plan *p = plan_get(&key, &s);
    if (p != NULL) {
        s = execute(p, ctx, A, B, C);
    } else if (s == dnnl_success) { /* a full table: this product's own primitive, once */
        if ((s = plan_make(&key, NULL, 0)) == dnnl_success) {
            s = execute(&key, ctx, A, B, C);
        }
        if (key.prim != NULL) {
            dn.dnnl_primitive_destroy(key.prim);
        }
    }
    if (s != dnnl_success) {
        ZR_FAIL(s == dnnl_out_of_memory ? ZR_ERR_NOMEM : ZR_ERR_INTERNAL,
                "oneDNN's bf16 product %d x %d x %d (ta %d, tb %d) failed: status %d", M, N, K, ta,
                tb, (int)s);
    }
    return ZR_OK;
}

void zr_blas_bf16_ctx_free(zr_blas_bf16_ctx *ctx)
{
    if (ctx->stream != NULL) {
        dn.dnnl_stream_destroy((dnnl_stream_t)ctx->stream);
    }
    free(ctx->pad);
    memset(ctx, 0, sizeof *ctx);
}

#else /* built without oneDNN 2's header */

zr_status zr_blas_bf16_load(const char **kernel_out)
{
    *kernel_out = NULL;
    ZR_FAIL(ZR_ERR_IO, "zr was built without oneDNN 2's header (Debian's libdnnl-dev): "
                       "no bf16 products on the CPU");
}

zr_status zr_blas_gemm_bf16(zr_blas_bf16_ctx *ctx, int ta, int tb, int M, int N, int K,
                            const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                            float *C, int ldc)
{
    (void)ctx, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B;
    (void)ldb, (void)beta, (void)C, (void)ldc;
    const char *k;
    return zr_blas_bf16_load(&k);
}

void zr_blas_bf16_ctx_free(zr_blas_bf16_ctx *ctx)
{
    free(ctx->pad);
    memset(ctx, 0, sizeof *ctx);
}

#endif
