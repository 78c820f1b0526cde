/*
 * cudalib.c - cuBLAS, cuBLASLt and NCCL opened on first use (cudalib.h says why and
 * where from).
 *
 * A library is a list of files opened in order from one place (cuBLAS:
 * libcublasLt, then libcublas, which needs it: once the first is open under
 * its soname, the loader takes it for the second's dependency), then its
 * functions are looked up in the last file. Each library has its own
 * pthread_once, its own outcome (the table, or the message of why not) and
 * is tried once per process; a failure is returned by every load, each time
 * recorded anew as the caller's error.
 *
 * The emulator build opens nothing: its tables point at the emulator's own
 * functions, which are linked into the program (tests/emu).
 *
 * Compiled only where CUDA is built: nothing else calls it.
 */
#define _POSIX_C_SOURCE 200809L

#include "cudalib.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !ZR_CUDA_EMU
#include <dlfcn.h>
#endif

#define STR_(x) #x
#define STR(x)  STR_(x) /* the value of a macro, as a string */

/* What one library is, and what came of loading it. */
typedef struct lib {
    const char *name;     /* "cuBLAS" */
    const char *dir;      /* the folder the build found it in; "" when unknown */
    const char *files[3]; /* sonames, opened in this order; NULL ends the list */
    const char *built;    /* the version of the headers zr was compiled against */
    pthread_once_t once;
    zr_status st;
    char path[512]; /* the file the functions come from */
    char msg[2048]; /* why it failed */
} lib;

#ifndef ZR_CUBLAS_DIR
#define ZR_CUBLAS_DIR ""
#endif
#ifndef ZR_NCCL_DIR
#define ZR_NCCL_DIR ""
#endif

#if !ZR_CUDA_EMU

static void msg_add(lib *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Append to l->msg, cut at its size. */
static void msg_add(lib *l, const char *fmt, ...)
{
    size_t used = strlen(l->msg);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->msg + used, sizeof l->msg - used, fmt, ap);
    va_end(ap);
}

/*
 * Open every file of l from folder dir ("" = by soname, the loader's search);
 * *last: the last one. A failure closes what it opened and is added to l->msg
 * with the file and the loader's words.
 */
static int open_from(lib *l, const char *dir, void **last)
{
    void *h[3] = {NULL, NULL, NULL};
    int i = 0;
    for (; l->files[i] != NULL; i++) {
        snprintf(l->path, sizeof l->path, "%s%s%s", dir, dir[0] != '\0' ? "/" : "", l->files[i]);
        h[i] = dlopen(l->path, RTLD_NOW | RTLD_LOCAL);
        if (h[i] == NULL) {
            const char *why = dlerror();
            why = why != NULL ? why : "not loaded";
            /* glibc's message starts with the name it was given; others may not */
            int named = strncmp(why, l->path, strlen(l->path)) == 0;
            msg_add(l, "%s%s%s%s", l->msg[0] != '\0' ? "; " : "", named ? "" : l->path,
                    named ? "" : ": ", why);
            break;
        }
    }
    if (l->files[i] != NULL) {
        while (i-- > 0) {
            dlclose(h[i]);
        }
        return 0;
    }
    *last = h[i - 1];
    return 1;
}

/* l's files from ZR_CUDA_LIBDIR alone, else the build's folder, then by soname. */
static int open_lib(lib *l, void **h)
{
    const char *env = getenv("ZR_CUDA_LIBDIR");
    if (env != NULL && env[0] != '\0') {
        if (open_from(l, env, h)) {
            return 1;
        }
        msg_add(l, " (tried ZR_CUDA_LIBDIR=%s only)", env);
        return 0;
    }
    if ((l->dir[0] != '\0' && open_from(l, l->dir, h)) || open_from(l, "", h)) {
        l->msg[0] = '\0'; /* the build's folder failed, the loader's search did not */
        return 1;
    }
    msg_add(l, " (tried %s%s the loader's search path, LD_LIBRARY_PATH included)",
            l->dir[0] != '\0' ? l->dir : "no build folder", l->dir[0] != '\0' ? ", then" : ";");
    return 0;
}

/* Look up name in h into *slot (a function pointer of the table). */
static int lookup(lib *l, void *h, const char *name, void *slot)
{
    void *p = dlsym(h, name);
    if (p == NULL) {
        const char *why = dlerror();
        snprintf(l->msg, sizeof l->msg, "%s lacks %s (%s); zr was built against %s", l->path, name,
                 why != NULL ? why : "not found", l->built);
        return 0;
    }
    _Static_assert(sizeof p == sizeof(void (*)(void)), "function pointers as wide as void *");
    memcpy(slot, &p, sizeof p); /* POSIX: dlsym's result is the function's address */
    return 1;
}

#define SYM(l, h, t, f) lookup((l), (h), STR(f), (void *)&(t)->f)

#else /* ZR_CUDA_EMU: the emulator's functions, by name */

static int open_lib(lib *l, void **h)
{
    (void)l;
    *h = NULL; /* nothing to open */
    return 1;
}

#define SYM(l, h, t, f) ((void)(l), (void)(h), (t)->f = f, 1)

#endif /* ZR_CUDA_EMU */

/* Keep the outcome of loading l, and say where it came from (ZR_DEBUG=debug). */
static void settle(lib *l, int ok)
{
    l->st = ok ? ZR_OK : ZR_ERR_DEVICE;
    if (ok) {
        ZR_DEBUG("%s: %s", l->name, l->path[0] != '\0' ? l->path : "the emulator's");
    }
}

/* l's outcome once it is known: ZR_OK, or its failure recorded as the caller's. */
static zr_status outcome(const lib *l)
{
    if (l->st != ZR_OK) {
        ZR_FAIL(ZR_ERR_DEVICE, "%s could not be loaded: %s", l->name, l->msg);
    }
    return ZR_OK;
}

/* ---- cuBLAS ------------------------------------------------------------------------ */

static lib cublas_lib = {
    .name = "cuBLAS",
    .dir = ZR_CUBLAS_DIR,
    .files = {"libcublasLt.so." STR(CUBLAS_VER_MAJOR), "libcublas.so." STR(CUBLAS_VER_MAJOR)},
    .built = "cuBLAS " STR(CUBLAS_VER_MAJOR) "." STR(CUBLAS_VER_MINOR) "." STR(CUBLAS_VER_PATCH),
    .once = PTHREAD_ONCE_INIT,
};
static zr_cudalib_cublas cublas;

static void cublas_once(void)
{
    lib *l = &cublas_lib;
    zr_cudalib_cublas *t = &cublas;
    void *h = NULL;
    int ok = open_lib(l, &h) && SYM(l, h, t, cublasCreate) && SYM(l, h, t, cublasDestroy) &&
             SYM(l, h, t, cublasSetStream) && SYM(l, h, t, cublasSetMathMode) &&
             SYM(l, h, t, cublasGemmEx) && SYM(l, h, t, cublasGemmStridedBatchedEx) &&
             SYM(l, h, t, cublasGetStatusName) && SYM(l, h, t, cublasGetStatusString);
    settle(l, ok);
}

zr_status zr_cudalib_load_cublas(const zr_cudalib_cublas **out)
{
    *out = NULL;
    pthread_once(&cublas_lib.once, cublas_once);
    ZR_CHECK(outcome(&cublas_lib));
    *out = &cublas;
    return ZR_OK;
}

/* ---- cuBLASLt ---------------------------------------------------------------------- */

static lib cublaslt_lib = {
    .name = "cuBLASLt",
    .dir = ZR_CUBLAS_DIR,
    .files = {"libcublasLt.so." STR(CUBLAS_VER_MAJOR)},
    .built = "cuBLAS " STR(CUBLAS_VER_MAJOR) "." STR(CUBLAS_VER_MINOR) "." STR(CUBLAS_VER_PATCH),
    .once = PTHREAD_ONCE_INIT,
};
static zr_cudalib_cublaslt cublaslt;

static void cublaslt_once(void)
{
    lib *l = &cublaslt_lib;
    zr_cudalib_cublaslt *t = &cublaslt;
    void *h = NULL;
    int ok =
        open_lib(l, &h) && SYM(l, h, t, cublasLtCreate) && SYM(l, h, t, cublasLtDestroy) &&
        SYM(l, h, t, cublasLtGetStatusName) && SYM(l, h, t, cublasLtGetStatusString) &&
        SYM(l, h, t, cublasLtMatmulDescCreate) && SYM(l, h, t, cublasLtMatmulDescDestroy) &&
        SYM(l, h, t, cublasLtMatmulDescSetAttribute) && SYM(l, h, t, cublasLtMatrixLayoutCreate) &&
        SYM(l, h, t, cublasLtMatrixLayoutDestroy) && SYM(l, h, t, cublasLtMatmulPreferenceCreate) &&
        SYM(l, h, t, cublasLtMatmulPreferenceDestroy) &&
        SYM(l, h, t, cublasLtMatmulPreferenceSetAttribute) &&
        SYM(l, h, t, cublasLtMatmulAlgoGetHeuristic) && SYM(l, h, t, cublasLtMatmul);
    settle(l, ok);
}

zr_status zr_cudalib_load_cublaslt(const zr_cudalib_cublaslt **out)
{
    *out = NULL;
    pthread_once(&cublaslt_lib.once, cublaslt_once);
    ZR_CHECK(outcome(&cublaslt_lib));
    *out = &cublaslt;
    return ZR_OK;
}

/* ---- NCCL -------------------------------------------------------------------------- */

#if ZR_NCCL

static lib nccl_lib = {
    .name = "NCCL",
    .dir = ZR_NCCL_DIR,
    .files = {"libnccl.so." STR(NCCL_MAJOR)},
    .built = "NCCL " STR(NCCL_MAJOR) "." STR(NCCL_MINOR) "." STR(NCCL_PATCH),
    .once = PTHREAD_ONCE_INIT,
};
static zr_cudalib_nccl nccl;

static void nccl_once(void)
{
    lib *l = &nccl_lib;
    zr_cudalib_nccl *t = &nccl;
    void *h = NULL;
    int ok = open_lib(l, &h) && SYM(l, h, t, ncclGetVersion) && SYM(l, h, t, ncclGetErrorString) &&
             SYM(l, h, t, ncclGetUniqueId) && SYM(l, h, t, ncclCommInitRank) &&
             SYM(l, h, t, ncclCommSplit) && SYM(l, h, t, ncclCommDestroy) &&
             SYM(l, h, t, ncclCommAbort) && SYM(l, h, t, ncclCommGetAsyncError) &&
             SYM(l, h, t, ncclCommCount) && SYM(l, h, t, ncclCommUserRank) &&
             SYM(l, h, t, ncclGroupStart) && SYM(l, h, t, ncclGroupEnd) && SYM(l, h, t, ncclSend) &&
             SYM(l, h, t, ncclRecv) && SYM(l, h, t, ncclAllGather) &&
             SYM(l, h, t, ncclReduceScatter);
    settle(l, ok);
}

zr_status zr_cudalib_load_nccl(const zr_cudalib_nccl **out)
{
    *out = NULL;
    pthread_once(&nccl_lib.once, nccl_once);
    ZR_CHECK(outcome(&nccl_lib));
    *out = &nccl;
    return ZR_OK;
}

#endif /* ZR_NCCL */
