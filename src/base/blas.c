/*
 * blas.c - OpenBLAS opened after choosing its kernels (blas.h says why and
 * where from).
 *
 * The load, once per process: open the library; ask which kernels it chose
 * by itself; zr_blas_choose decides from that, the CPU's features and the
 * user's OPENBLAS_CORETYPE; where it names other kernels, the library is
 * closed (its destructor joins its threads), and opened again with
 * OPENBLAS_CORETYPE set, which its constructor reads; then the variable is
 * removed again, as the user had none. A library that does not go away on
 * dlclose (loaded by the program itself, or held by another handle) keeps
 * its kernels, and the report says so.
 */
#define _POSIX_C_SOURCE 200809L

#include "blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef ZR_BLAS_DIR
#define ZR_BLAS_DIR ""
#endif
#define ZR_BLAS_SONAME "libopenblas.so.0"

/* ---- the choice ----------------------------------------------------------------- */

/* OpenBLAS's x86-64 cores (OPENBLAS_CORETYPE's names) by the width of their kernels. */
static const struct {
    const char *name;
    int level;
} cores[] = {
    {"Prescott", 0},     {"Katmai", 0},      {"Coppermine", 0},     {"Northwood", 0},
    {"Banias", 0},       {"Atom", 0},        {"Core2", 0},          {"Penryn", 0},
    {"Dunnington", 0},   {"Nehalem", 0},     {"Athlon", 0},         {"Opteron", 0},
    {"Opteron_SSE3", 0}, {"OpteronSSE3", 0}, {"Barcelona", 0},      {"Nano", 0},
    {"Bobcat", 0},       {"Sandybridge", 1}, {"Bulldozer", 1},      {"Piledriver", 1},
    {"Steamroller", 1},  {"Excavator", 1},   {"Haswell", 2},        {"Zen", 2},
    {"SkylakeX", 3},     {"Cooperlake", 4},  {"SapphireRapids", 4},
};

int zr_blas_core_level(const char *core)
{
    for (size_t i = 0; core != NULL && i < sizeof cores / sizeof cores[0]; i++) {
        if (strcasecmp(core, cores[i].name) == 0) {
            return cores[i].level;
        }
    }
    return -1;
}

static int features_level(const zr_cpu_features *f)
{
    return f->avx512_bf16 ? 4 : f->avx512 ? 3 : f->avx2_fma ? 2 : f->avx ? 1 : 0;
}

const char *zr_blas_core_for(const zr_cpu_features *f)
{
    static const char *const best[] = {"Prescott", "Sandybridge", "Haswell", "SkylakeX",
                                       "Cooperlake"};
    int level = features_level(f);
    return level == 2 && f->vendor == ZR_CPU_VENDOR_AMD ? "Zen" : best[level];
}

const char *zr_blas_choose(const zr_cpu_features *f, const char *reported, const char *user,
                           int capped, int dynamic, char *why, size_t n)
{
    char fs[128];
    zr_cpu_features_str(f, fs, sizeof fs);
    int have = zr_blas_core_level(reported), want = features_level(f);
    const char *best = zr_blas_core_for(f);
    if (user != NULL && user[0] != '\0') {
        snprintf(why, n, "the user's OPENBLAS_CORETYPE=%s", user);
        return NULL;
    }
    if (!dynamic) {
        snprintf(why, n, "OpenBLAS built for %s only (no DYNAMIC_ARCH)", reported);
        return NULL;
    }
    if (have < 0) {
        snprintf(why, n, "OpenBLAS chose %s, kernels zr does not know", reported);
        return NULL;
    }
    if (have < want) {
        snprintf(why, n, "set by zr: OpenBLAS chose %s, weaker than the CPU's %s allow", reported,
                 fs);
        return best;
    }
    if (capped && have > want) {
        snprintf(why, n, "set by zr: OpenBLAS chose %s, wider than ZR_CPU=%s allows", reported,
                 getenv("ZR_CPU") != NULL ? getenv("ZR_CPU") : "");
        return best;
    }
    snprintf(why, n, "chosen by OpenBLAS, as the CPU's %s allow", fs);
    return NULL;
}

/* ---- the load ------------------------------------------------------------------- */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static zr_status load_st = ZR_OK;
static char load_msg[2048];
static zr_blas blas;

static void msg_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void msg_add(const char *fmt, ...)
{
    size_t used = strlen(load_msg);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(load_msg + used, sizeof load_msg - used, fmt, ap);
    va_end(ap);
}

/* Opens file; the loader's words go to load_msg when it cannot. */
static void *open_file(const char *file)
{
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *why = dlerror();
        msg_add("%s%s", load_msg[0] != '\0' ? "; " : "", why != NULL ? why : file);
    } else {
        snprintf(blas.path, sizeof blas.path, "%s", file);
    }
    return h;
}

/* ZR_BLAS_LIB alone, else the soname, else the build's folder. */
static void *open_lib(void)
{
    const char *env = getenv("ZR_BLAS_LIB");
    if (env != NULL && env[0] != '\0') {
        void *h = open_file(env);
        if (h == NULL) {
            msg_add(" (tried ZR_BLAS_LIB=%s only)", env);
        }
        return h;
    }
    void *h = open_file(ZR_BLAS_SONAME);
    if (h == NULL && ZR_BLAS_DIR[0] != '\0') {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", ZR_BLAS_DIR, ZR_BLAS_SONAME);
        h = open_file(path);
    }
    if (h == NULL) {
        msg_add(" (tried %s by the loader's search path, LD_LIBRARY_PATH included%s%s; "
                "ZR_BLAS_LIB=file names another)",
                ZR_BLAS_SONAME, ZR_BLAS_DIR[0] != '\0' ? ", then " : "", ZR_BLAS_DIR);
    } else {
        load_msg[0] = '\0';
    }
    return h;
}

/* The table's functions from h (the openblas_* ones may be missing); 0 without cblas_sgemm. */
static int lookup(void *h)
{
    void *p[4] = {dlsym(h, "cblas_sgemm"), dlsym(h, "openblas_set_num_threads"),
                  dlsym(h, "openblas_get_corename"), dlsym(h, "openblas_get_config")};
    _Static_assert(sizeof p[0] == sizeof(void (*)(void)), "function pointers as wide as void *");
    memcpy(&blas.cblas_sgemm, &p[0], sizeof p[0]); /* POSIX: dlsym's result is the function */
    memcpy(&blas.openblas_set_num_threads, &p[1], sizeof p[1]);
    memcpy(&blas.openblas_get_corename, &p[2], sizeof p[2]);
    memcpy(&blas.openblas_get_config, &p[3], sizeof p[3]);
    if (p[0] == NULL) {
        msg_add("%s lacks cblas_sgemm", blas.path);
        return 0;
    }
    const char *core = blas.openblas_get_corename != NULL ? blas.openblas_get_corename() : NULL;
    snprintf(blas.core, sizeof blas.core, "%s", core != NULL ? core : "unknown");
    return 1;
}

/* Closes h and opens the library again with OPENBLAS_CORETYPE=core; 0 if it stayed loaded. */
static void *reopen(void *h, const char *core, int *ok)
{
    dlclose(h);
    void *still = dlopen(blas.path, RTLD_NOW | RTLD_NOLOAD);
    if (still != NULL) {
        *ok = 0; /* another handle holds it: its kernels are fixed */
        return still;
    }
    char path[sizeof blas.path];
    snprintf(path, sizeof path, "%s", blas.path);
    setenv("OPENBLAS_CORETYPE", core, 1);
    h = open_file(path);
    unsetenv("OPENBLAS_CORETYPE"); /* read by the constructor; the user had none */
    *ok = h != NULL;
    return h;
}

static void load_once(void)
{
    zr_cpu_features f;
    zr_cpu_features_get(&f);
    zr_cpu_features_str(&f, blas.features, sizeof blas.features);
    const char *user = getenv("OPENBLAS_CORETYPE");
    int preloaded =
        getenv("ZR_BLAS_LIB") == NULL && dlopen(ZR_BLAS_SONAME, RTLD_NOW | RTLD_NOLOAD) != NULL;
    void *h = open_lib();
    if (h == NULL || !lookup(h)) {
        load_st = ZR_ERR_IO;
        return;
    }
    snprintf(blas.reported, sizeof blas.reported, "%s", blas.core);
    const char *config = blas.openblas_get_config != NULL ? blas.openblas_get_config() : NULL;
    int dynamic = config != NULL && strstr(config, "DYNAMIC_ARCH") != NULL;
    const char *core = zr_blas_choose(&f, blas.core, user, zr_cpu_cap() < ZR_CPU_AVX512, dynamic,
                                      blas.how, sizeof blas.how);
    int ok = 1;
    if (core != NULL && preloaded) {
        snprintf(blas.how, sizeof blas.how,
                 "chosen by OpenBLAS when the program loaded it; zr would run %s", core);
    } else if (core != NULL && ((h = reopen(h, core, &ok)) == NULL || !lookup(h))) {
        load_st = ZR_ERR_IO;
        return;
    } else if (core != NULL && (!ok || strcasecmp(blas.core, core) != 0)) {
        size_t used = strlen(blas.how);
        snprintf(blas.how + used, sizeof blas.how - used, "; zr asked for %s, %s", core,
                 ok ? "which this OpenBLAS does not have" : "but the library stayed loaded");
    }
    ZR_INFO("BLAS %s: %s kernels (%s)", blas.path, blas.core, blas.how);
}

zr_status zr_blas_load(const zr_blas **out)
{
    *out = NULL;
    pthread_once(&once, load_once);
    if (load_st != ZR_OK) {
        ZR_FAIL(load_st, "the BLAS could not be loaded: %s", load_msg);
    }
    *out = &blas;
    return ZR_OK;
}

const zr_blas *zr_blas_get(void)
{
    const zr_blas *b = NULL;
    if (zr_blas_load(&b) != ZR_OK) {
        zr_die(__FILE__, __LINE__, "install libopenblas0 or set ZR_BLAS_LIB", "%s",
               zr_error_message());
    }
    return b;
}

void zr_blas_set_threads(int threads)
{
    const zr_blas *b = zr_blas_get();
    if (b->openblas_set_num_threads != NULL) {
        b->openblas_set_num_threads(threads);
    }
}

double zr_blas_sgemm_rate(int n, int reps, int on_cpu)
{
    const zr_blas *bl = zr_blas_get();
    size_t nn = (size_t)n * (size_t)n;
    float *a = NULL, *b = NULL, *c = NULL;
    if (zr_alloc_at((void **)&a, 3 * nn * sizeof *a, __FILE__, __LINE__) != ZR_OK) {
        return -1;
    }
    b = a + nn;
    c = b + nn;
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 13) * 0.01f;
        b[i] = (float)(i % 7) * 0.02f;
    }
    double t[33];
    reps = reps < 1 ? 1 : reps > 32 ? 32 : reps;
    for (int r = 0; r <= reps; r++) {
        double t0 = on_cpu ? zr_cpu_thread_time() : zr_now();
        bl->cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                        c, n);
        t[r] = (on_cpu ? zr_cpu_thread_time() : zr_now()) - t0;
    }
    zr_free(a);
    return 2.0 * (double)n * (double)n * (double)n / zr_median(t + 1, reps) * 1e-9;
}

/* ---- the choice of bf16 products (blas_bf16.c runs them) ------------------------- */

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

int zr_blas_bf16_here(const char **kernel, char *why, size_t n)
{
    zr_cpu_features f;
    zr_cpu_features_get(&f);
    *kernel = NULL;
    if (!zr_blas_bf16_choose(&f, getenv("ZR_CPU_BF16"), why, n)) {
        return 0;
    }
    if (zr_blas_bf16_load(kernel) != ZR_OK) {
        snprintf(why, n, "fp32 products: %s", zr_error_message());
        zr_error_clear();
        return 0;
    }
    return 1;
}
