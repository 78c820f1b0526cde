/*
 * test_cudalib.c - CUDA's libraries are opened by the first use that needs
 * them, never at start-up (src/base/cudalib.h):
 *
 *   - no program of this build (zr, every test program) has a DT_NEEDED
 *     entry for libcudart, libcublas, libcublasLt, libnccl or the driver,
 *     libcuda (read from the files' ELF dynamic sections), so they start on
 *     a node without CUDA;
 *   - a process that ran CPU work (the model's forward and backward, the CPU
 *     device) maps none of them (/proc/self/maps);
 *   - the first load of cuBLAS, of cuBLASLt and of NCCL opens them (with a toolkit: here
 *     cuBLAS and cuBLASLt, NCCL; their calls answer: ncclGetVersion gives
 *     the headers' major version, ncclGetUniqueId works without a GPU,
 *     cublasCreate succeeds or says why), a second load gives the same
 *     table; in the emulator build the tables hold the emulator's functions;
 *   - --missing: with ZR_CUDA_LIBDIR at a folder that does not exist, each
 *     load fails with ZR_ERR_DEVICE naming the library, the file tried and
 *     the loader's reason, every time it is asked, and nothing is mapped.
 *
 * A build without CUDA runs the first two (nothing to load); --missing
 * needs real libraries, so it is skipped in the emulator build.
 */
#define _POSIX_C_SOURCE 200809L

#include "test.h"
#include "zr/device.h"
#include "zr/model.h"

#include "../src/base/cudalib.h" /* the tables under test */

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#define STR_(x) #x
#define STR(x)  STR_(x) /* the value of a macro, as a string */

/* File names (after the last '/') that a process must not need or map before CUDA work. */
static const char *const cuda_libs[] = {"libcudart.", "libcublas.", "libcublasLt.", "libnccl.",
                                        "libcuda."};

/* The CUDA library name starts with, or NULL. */
static const char *cuda_lib_of(const char *name)
{
    for (size_t i = 0; i < sizeof cuda_libs / sizeof cuda_libs[0]; i++) {
        if (strncmp(name, cuda_libs[i], strlen(cuda_libs[i])) == 0) {
            return cuda_libs[i];
        }
    }
    return NULL;
}

/* ---- DT_NEEDED ---------------------------------------------------------------------- */

static int read_at(int fd, void *buf, size_t n, uint64_t off)
{
    return pread(fd, buf, n, (off_t)off) == (ssize_t)n;
}

/*
 * The DT_NEEDED names of the 64-bit ELF file path, separated by spaces, into
 * out; -1 when it is not one (a script, a dependency file).
 */
static int elf_needed(const char *path, char *out, size_t size)
{
    int fd = open(path, O_RDONLY);
    Elf64_Ehdr eh;
    int n = -1;
    out[0] = '\0';
    if (fd < 0 || !read_at(fd, &eh, sizeof eh, 0) || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr)) {
        goto done;
    }
    n = 0;
    for (int i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh, strh;
        if (!read_at(fd, &sh, sizeof sh, eh.e_shoff + (uint64_t)i * sizeof sh) ||
            sh.sh_type != SHT_DYNAMIC ||
            !read_at(fd, &strh, sizeof strh, eh.e_shoff + (uint64_t)sh.sh_link * sizeof strh)) {
            continue;
        }
        for (uint64_t off = 0; off + sizeof(Elf64_Dyn) <= sh.sh_size; off += sizeof(Elf64_Dyn)) {
            Elf64_Dyn d;
            char name[256];
            if (!read_at(fd, &d, sizeof d, sh.sh_offset + off) || d.d_tag == DT_NULL) {
                break;
            }
            if (d.d_tag != DT_NEEDED ||
                pread(fd, name, sizeof name - 1, (off_t)(strh.sh_offset + d.d_un.d_val)) <= 0) {
                continue;
            }
            name[sizeof name - 1] = '\0';
            size_t used = strlen(out);
            snprintf(out + used, size - used, "%s%s", used > 0 ? " " : "", name);
            n++;
        }
    }
done:
    if (fd >= 0) {
        close(fd);
    }
    return n;
}

/* Check one program: no CUDA library among its DT_NEEDED; returns 1 when it was an ELF file. */
static int check_needed(const char *path)
{
    char needed[4096];
    int n = elf_needed(path, needed, sizeof needed);
    if (n < 0) {
        return 0;
    }
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", needed);
    char *save = NULL;
    for (char *w = strtok_r(copy, " ", &save); w != NULL; w = strtok_r(NULL, " ", &save)) {
        TEST_CHECKF(cuda_lib_of(w) == NULL, "%s needs %s at start-up (DT_NEEDED: %s)", path, w,
                    needed);
    }
    return 1;
}

static char self_dir[PATH_MAX]; /* build/<variant>/tests */

static void test_no_cuda_needed(void)
{
    char path[PATH_MAX + 512], needed[4096];
    /* the parser sees what the loader sees: this program needs the C library */
    snprintf(path, sizeof path, "%s/test_cudalib", self_dir);
    TEST_CHECKF(elf_needed(path, needed, sizeof needed) > 0 && strstr(needed, "libc.so") != NULL,
                "%s: DT_NEEDED '%s' lacks the C library", path, needed);
    snprintf(path, sizeof path, "%s/../zr", self_dir);
    TEST_CHECKF(check_needed(path), "%s is not an ELF program", path);
    DIR *d = opendir(self_dir);
    TEST_CHECK(d != NULL);
    int programs = 0;
    for (struct dirent *e = d ? readdir(d) : NULL; e != NULL; e = readdir(d)) {
        if (strncmp(e->d_name, "test_", 5) == 0 && strchr(e->d_name, '.') == NULL) {
            snprintf(path, sizeof path, "%s/%s", self_dir, e->d_name);
            programs += check_needed(path);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    printf("  zr and %d test programs: no DT_NEEDED entry for CUDA's libraries\n", programs);
    TEST_CHECKF(programs >= 10, "only %d test programs found in %s", programs, self_dir);
}

/* ---- what is mapped ---------------------------------------------------------------- */

/* The CUDA libraries this process maps now, one file name each, space-separated, into out. */
static void mapped_cuda_libs(char *out, size_t size)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/self/maps", "r");
    TEST_CHECK(f != NULL);
    char line[4096];
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        char *slash = strrchr(line, '/');
        if (slash == NULL || cuda_lib_of(slash + 1) == NULL) {
            continue;
        }
        slash[strcspn(slash, "\n")] = '\0';
        if (strstr(out, slash + 1) == NULL) {
            size_t used = strlen(out);
            snprintf(out + used, size - used, "%s%s", used > 0 ? " " : "", slash + 1);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
}

/* CPU work through the library: a tiny GPT's forward and backward, the CPU device's memory. */
static void cpu_work(void)
{
    zr_gpt_config cfg = {
        .max_t = 8, .vocab = 32, .padded_vocab = 64, .layers = 1, .heads = 2, .channels = 16};
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, &cfg, 1, 8));
    int n = zr_gpt_config_unit_count(&cfg);
    float *p[8] = {NULL}, *g[8] = {NULL};
    for (int u = 0; u < n && u < 8; u++) {
        TEST_OK(zr_alloc_at((void **)&p[u], zr_gpt_unit_numel(&m, u) * sizeof(float), __FILE__,
                            __LINE__));
        TEST_OK(zr_alloc_at((void **)&g[u], zr_gpt_unit_numel(&m, u) * sizeof(float), __FILE__,
                            __LINE__));
        zr_gpt_unit_init_params(&m, u, p[u], 1);
    }
    int in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    TEST_OK(zr_gpt_forward_begin(&m, in, tg));
    for (int u = 0; u < n; u++) {
        TEST_OK(zr_gpt_forward_unit(&m, u, p[u], p[0]));
    }
    TEST_CHECK(zr_gpt_loss(&m) > 0);
    TEST_OK(zr_gpt_backward_begin(&m));
    for (int u = n - 1; u >= 0; u--) {
        TEST_OK(zr_gpt_backward_unit(&m, u, p[u], p[0], g[u], g[0]));
    }
    zr_device cpu = zr_device_cpu();
    zr_stream *s = NULL;
    void *a = NULL;
    TEST_OK(zr_stream_create(&cpu, &s));
    TEST_OK(zr_device_alloc_at(&cpu, &a, 4096, __FILE__, __LINE__));
    TEST_OK(zr_memset_async(a, 1, 4096, s));
    TEST_OK(zr_stream_sync(s));
    zr_device_free(&cpu, a);
    zr_stream_destroy(s);
    for (int u = 0; u < n && u < 8; u++) {
        zr_free(p[u]);
        zr_free(g[u]);
    }
    zr_gpt_free(&m);
}

static void test_cpu_work_maps_none(void)
{
    cpu_work();
    char mapped[4096];
    mapped_cuda_libs(mapped, sizeof mapped);
    TEST_CHECKF(mapped[0] == '\0', "CPU work mapped CUDA's libraries: %s", mapped);
}

/* ---- first use ---------------------------------------------------------------------- */

#if ZR_CUDA

static void test_first_use_loads_cublas(void)
{
    char mapped[4096];
    mapped_cuda_libs(mapped, sizeof mapped);
    TEST_CHECKF(strstr(mapped, "libcublas") == NULL, "cuBLAS mapped before its first use: %s",
                mapped);
    const zr_cudalib_cublas *t = NULL, *again = NULL;
    TEST_OK(zr_cudalib_load_cublas(&t));
    TEST_OK(zr_cudalib_load_cublas(&again));
    TEST_CHECK(t != NULL && t == again);
    if (t == NULL) {
        return;
    }
#if ZR_CUDA_EMU
    TEST_CHECK(t->cublasCreate == cublasCreate && t->cublasGemmEx == cublasGemmEx &&
               t->cublasGemmStridedBatchedEx == cublasGemmStridedBatchedEx &&
               t->cublasGetStatusString == cublasGetStatusString);
#else
    mapped_cuda_libs(mapped, sizeof mapped);
    TEST_CHECKF(strstr(mapped, "libcublas.so." STR(CUBLAS_VER_MAJOR)) != NULL &&
                    strstr(mapped, "libcublasLt.so." STR(CUBLAS_VER_MAJOR)) != NULL,
                "after the first load: %s", mapped);
    printf("  mapped after loading cuBLAS: %s\n", mapped);
#endif
    /* without a GPU cublasCreate fails, and says why; with one it works */
    cublasHandle_t h = NULL;
    cublasStatus_t st = t->cublasCreate(&h);
    printf("  cublasCreate: %s\n", t->cublasGetStatusName(st));
    TEST_CHECK(strlen(t->cublasGetStatusString(st)) > 0);
    if (st == CUBLAS_STATUS_SUCCESS) {
        TEST_CHECK(t->cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
    }
}

/* cuBLASLt alone (the epilogue GEMMs): the same table twice, the emulator's functions there. */
static void test_first_use_loads_cublaslt(void)
{
    const zr_cudalib_cublaslt *t = NULL, *again = NULL;
    TEST_OK(zr_cudalib_load_cublaslt(&t));
    TEST_OK(zr_cudalib_load_cublaslt(&again));
    TEST_CHECK(t != NULL && t == again);
    if (t == NULL) {
        return;
    }
#if ZR_CUDA_EMU
    TEST_CHECK(t->cublasLtCreate == cublasLtCreate && t->cublasLtMatmul == cublasLtMatmul &&
               t->cublasLtMatmulAlgoGetHeuristic == cublasLtMatmulAlgoGetHeuristic);
#else
    char mapped[4096];
    mapped_cuda_libs(mapped, sizeof mapped);
    TEST_CHECKF(strstr(mapped, "libcublasLt.so." STR(CUBLAS_VER_MAJOR)) != NULL,
                "after the first load: %s", mapped);
#endif
    TEST_CHECK(strlen(t->cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)) > 0);
}

#if ZR_NCCL
static void test_first_use_loads_nccl(void)
{
    char mapped[4096];
    mapped_cuda_libs(mapped, sizeof mapped);
    TEST_CHECKF(strstr(mapped, "libnccl") == NULL, "NCCL mapped before its first use: %s", mapped);
    const zr_cudalib_nccl *t = NULL, *again = NULL;
    TEST_OK(zr_cudalib_load_nccl(&t));
    TEST_OK(zr_cudalib_load_nccl(&again));
    TEST_CHECK(t != NULL && t == again);
    if (t == NULL) {
        return;
    }
    int v = 0;
    TEST_CHECK(t->ncclGetVersion(&v) == ncclSuccess);
    TEST_CHECKF(v / 10000 == NCCL_MAJOR, "NCCL %d, built against major %d", v, NCCL_MAJOR);
    TEST_CHECK(strlen(t->ncclGetErrorString(ncclInvalidArgument)) > 0);
#if ZR_CUDA_EMU
    TEST_CHECK(t->ncclGetVersion == ncclGetVersion && t->ncclCommSplit == ncclCommSplit &&
               t->ncclSend == ncclSend && t->ncclRecv == ncclRecv);
#else
    mapped_cuda_libs(mapped, sizeof mapped);
    TEST_CHECKF(strstr(mapped, "libnccl.so." STR(NCCL_MAJOR)) != NULL, "after the first load: %s",
                mapped);
    printf("  NCCL %d; mapped after loading NCCL: %s\n", v, mapped);
    /* NCCL's unique id needs no GPU (the emulated one needs MPI, which this program has not) */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = t->ncclGetUniqueId(&id);
    TEST_CHECKF(r == ncclSuccess, "ncclGetUniqueId: %s", t->ncclGetErrorString(r));
#endif
}
#endif /* ZR_NCCL */

#if !ZR_CUDA_EMU
#define NOWHERE "/nonexistent/zr-test-cudalib"

/* Each load fails, every time, with the library, the file tried and the loader's reason. */
static void test_missing_library(void)
{
    for (int i = 0; i < 2; i++) {
        const zr_cudalib_cublas *t = &(zr_cudalib_cublas){0};
        TEST_FAILS(zr_cudalib_load_cublas(&t), ZR_ERR_DEVICE, "cuBLAS could not be loaded");
        TEST_CHECK(t == NULL);
        const char *msg = zr_error_message();
        TEST_CHECKF(strstr(msg, NOWHERE "/libcublasLt.so." STR(CUBLAS_VER_MAJOR)) != NULL &&
                        strstr(msg, "No such file") != NULL &&
                        strstr(msg, "ZR_CUDA_LIBDIR=" NOWHERE) != NULL,
                    "the message: %s", msg);
        if (i == 0) {
            printf("  the message: %s\n", msg);
        }
    }
    const zr_cudalib_cublaslt *lt = NULL;
    TEST_FAILS(zr_cudalib_load_cublaslt(&lt), ZR_ERR_DEVICE, "cuBLASLt could not be loaded");
    TEST_CHECKF(strstr(zr_error_message(), NOWHERE "/libcublasLt.so." STR(CUBLAS_VER_MAJOR)) !=
                    NULL,
                "the message: %s", zr_error_message());
#if ZR_NCCL
    const zr_cudalib_nccl *n = NULL;
    TEST_FAILS(zr_cudalib_load_nccl(&n), ZR_ERR_DEVICE, "NCCL could not be loaded");
    TEST_CHECKF(strstr(zr_error_message(), NOWHERE "/libnccl.so." STR(NCCL_MAJOR)) != NULL,
                "the message: %s", zr_error_message());
    printf("  the message: %s\n", zr_error_message());
#endif
    char mapped[4096];
    mapped_cuda_libs(mapped, sizeof mapped);
    TEST_CHECKF(mapped[0] == '\0', "failed loads left mapped: %s", mapped);
}
#endif /* !ZR_CUDA_EMU */

#endif /* ZR_CUDA */

int main(int argc, char **argv)
{
    int missing = argc > 1 && strcmp(argv[1], "--missing") == 0;
    ssize_t len = readlink("/proc/self/exe", self_dir, sizeof self_dir - 1);
    self_dir[len > 0 ? len : 0] = '\0';
    char *slash = strrchr(self_dir, '/');
    if (slash != NULL) {
        *slash = '\0';
    }
    if (missing) {
#if ZR_CUDA && !ZR_CUDA_EMU
        setenv("ZR_CUDA_LIBDIR", NOWHERE, 1); /* before the first load, which reads it */
        TEST_RUN(test_missing_library);
        return zr_test_finish();
#else
        return zr_test_skip("no CUDA libraries to miss in this build (%s)",
                            zr_device_cuda_built() ? "the emulator's" : "built without CUDA");
#endif
    }
    TEST_RUN(test_no_cuda_needed);
    TEST_RUN(test_cpu_work_maps_none);
#if ZR_CUDA
    TEST_RUN(test_first_use_loads_cublas);
    TEST_RUN(test_first_use_loads_cublaslt);
#if ZR_NCCL
    TEST_RUN(test_first_use_loads_nccl);
#endif
#endif
    return zr_test_finish();
}
