/*
 * test_blas.c - the BLAS runs the kernels the CPU's features allow
 * (src/base/blas.h), on whatever CPU runs the test:
 *
 *   - zr_blas_choose on made-up CPUs: a core weaker than the features allow
 *     (Prescott on AVX-512 BF16, on AVX-512, on AVX2+FMA from Intel and from
 *     AMD; Haswell on AVX-512; SkylakeX on AVX512_BF16) becomes the right
 *     one; a core as wide as the CPU, a core zr does not know, a user's
 *     OPENBLAS_CORETYPE and a single-core build are left alone; a ZR_CPU cap
 *     lowers a wider core and nothing else does; names in any case;
 *   - in fresh processes (this program with --core, which opens the BLAS
 *     through zr and prints what it runs): with OPENBLAS_CORETYPE=Prescott the
 *     user's Prescott stays; without it the core is not weaker than this
 *     CPU's features allow (where OpenBLAS misjudges the CPU, as on Intel VMs
 *     that hide their model, this is the correction), the choice made again
 *     on the core it ended with changes nothing, and OPENBLAS_CORETYPE is not
 *     left in the environment; with ZR_CPU=avx2 the kernels are at most AVX2;
 *   - the features agree with the compiler's own cpuid checks, the cores
 *     with the affinity mask, the launcher's advice names the launcher's
 *     option, and the FMA peak and an sgemm rate are positive.
 */
#define _GNU_SOURCE /* sched_getaffinity, setenv */

#include "test.h"
#include "zr/pool.h"

#include "../src/base/blas.h" /* the choice and the loader under test */

#include <sched.h>
#include <strings.h>

static const zr_cpu_features SSE2 = {ZR_CPU_VENDOR_INTEL, 0, 0, 0, 0, 0};
static const zr_cpu_features AVX2 = {ZR_CPU_VENDOR_INTEL, 1, 1, 0, 0, 0};
static const zr_cpu_features ZEN2 = {ZR_CPU_VENDOR_AMD, 1, 1, 0, 0, 0};
static const zr_cpu_features SKX = {ZR_CPU_VENDOR_INTEL, 1, 1, 1, 0, 0};
static const zr_cpu_features SPR = {ZR_CPU_VENDOR_INTEL, 1, 1, 1, 1, 1};
static const zr_cpu_features ZEN4 = {ZR_CPU_VENDOR_AMD, 1, 1, 1, 1, 0};

/* zr_blas_choose's answer ("-" for NULL) contains want, and its reason contains why. */
static void choice_is(const zr_cpu_features *f, const char *reported, const char *user, int capped,
                      int dynamic, const char *want, const char *why)
{
    char reason[256];
    const char *got = zr_blas_choose(f, reported, user, capped, dynamic, reason, sizeof reason);
    TEST_CHECKF((got == NULL && want == NULL) ||
                    (got != NULL && want != NULL && strcmp(got, want) == 0),
                "reported %s, user %s, capped %d, dynamic %d: chose %s, expected %s (%s)", reported,
                user != NULL ? user : "-", capped, dynamic, got != NULL ? got : "nothing",
                want != NULL ? want : "nothing", reason);
    TEST_CHECKF(strstr(reason, why) != NULL, "reason '%s' lacks '%s'", reason, why);
}

static void test_choose(void)
{
    /* weaker than the features allow: the right core */
    choice_is(&SPR, "Prescott", NULL, 0, 1, "Cooperlake", "weaker than the CPU's avx512");
    choice_is(&SKX, "Prescott", NULL, 0, 1, "SkylakeX", "OpenBLAS chose Prescott");
    choice_is(&AVX2, "Nehalem", NULL, 0, 1, "Haswell", "avx2+fma");
    choice_is(&AVX2, "Sandybridge", NULL, 0, 1, "Haswell", "weaker");
    choice_is(&ZEN2, "Prescott", NULL, 0, 1, "Zen", "weaker");
    choice_is(&SKX, "Haswell", NULL, 0, 1, "SkylakeX", "weaker");
    choice_is(&ZEN4, "Zen", NULL, 0, 1, "Cooperlake", "weaker");
    choice_is(&SPR, "SkylakeX", NULL, 0, 1, "Cooperlake", "weaker");
    choice_is(&SPR, "PRESCOTT", NULL, 0, 1, "Cooperlake", "weaker"); /* any case */
    /* as wide as the CPU: left alone */
    choice_is(&SPR, "Cooperlake", NULL, 0, 1, NULL, "chosen by OpenBLAS");
    choice_is(&SPR, "SapphireRapids", NULL, 0, 1, NULL, "chosen by OpenBLAS");
    choice_is(&SKX, "skylakex", NULL, 0, 1, NULL, "chosen by OpenBLAS");
    choice_is(&AVX2, "Zen", NULL, 0, 1, NULL, "chosen by OpenBLAS");
    choice_is(&ZEN2, "Haswell", NULL, 0, 1, NULL, "chosen by OpenBLAS");
    choice_is(&SSE2, "Prescott", NULL, 0, 1, NULL, "chosen by OpenBLAS");
    /* wider than the features, uncapped (the library knows better): left alone */
    choice_is(&AVX2, "SkylakeX", NULL, 0, 1, NULL, "chosen by OpenBLAS");
    /* the user's choice, a single-core build, an unknown core: left alone */
    choice_is(&SPR, "Prescott", "Prescott", 0, 1, NULL, "the user's OPENBLAS_CORETYPE=Prescott");
    choice_is(&SPR, "Haswell", "Haswell", 1, 1, NULL, "the user's");
    choice_is(&SPR, "Prescott", NULL, 0, 0, NULL, "no DYNAMIC_ARCH");
    choice_is(&SPR, "Zen5", NULL, 0, 1, NULL, "zr does not know");
    choice_is(&SPR, "", NULL, 0, 1, NULL, "zr does not know");
    /* an empty OPENBLAS_CORETYPE is no choice */
    choice_is(&SPR, "Prescott", "", 0, 1, "Cooperlake", "weaker");
    /* ZR_CPU caps the features: a wider core comes down to them */
    choice_is(&AVX2, "Cooperlake", NULL, 1, 1, "Haswell", "wider than ZR_CPU");
    choice_is(&ZEN2, "SkylakeX", NULL, 1, 1, "Zen", "wider than ZR_CPU");
    choice_is(&SSE2, "Haswell", NULL, 1, 1, "Prescott", "wider than ZR_CPU");
    choice_is(&AVX2, "Prescott", NULL, 1, 1, "Haswell", "weaker");
    /* the levels and the best core per CPU */
    TEST_EQ_INT(zr_blas_core_level("prescott"), 0);
    TEST_EQ_INT(zr_blas_core_level("Haswell"), 2);
    TEST_EQ_INT(zr_blas_core_level("COOPERLAKE"), 4);
    TEST_EQ_INT(zr_blas_core_level("Zen5"), -1);
    TEST_EQ_INT(zr_blas_core_level(NULL), -1);
    TEST_CHECK(strcmp(zr_blas_core_for(&SPR), "Cooperlake") == 0);
    TEST_CHECK(strcmp(zr_blas_core_for(&ZEN4), "Cooperlake") == 0);
    TEST_CHECK(strcmp(zr_blas_core_for(&SKX), "SkylakeX") == 0);
    TEST_CHECK(strcmp(zr_blas_core_for(&ZEN2), "Zen") == 0);
    TEST_CHECK(strcmp(zr_blas_core_for(&AVX2), "Haswell") == 0);
    TEST_CHECK(strcmp(zr_blas_core_for(&SSE2), "Prescott") == 0);
}

static const char *self; /* this program, for its --core children */

/* Runs this program with --core under env (an `env` argument list); *core, *env_left. */
static int child_core(const char *env, char *core, int *env_left)
{
    char cmd[1024], line[512] = "";
    snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE -u ZR_CPU -u ZR_BLAS_LIB %s %s --core", env,
             self);
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return 0;
    }
    int ok = fgets(line, sizeof line, p) != NULL;
    ok &= pclose(p) == 0;
    ok &= sscanf(line, "core=%63s env_left=%d", core, env_left) == 2;
    TEST_CHECKF(ok, "%s: printed '%s'", cmd, line);
    return ok;
}

static void test_processes(void)
{
    char core[64] = "", why[256];
    int left = -1;
    /* the user's choice stays, even where it is the weakest */
    if (child_core("OPENBLAS_CORETYPE=Prescott", core, &left)) {
        TEST_CHECKF(strcasecmp(core, "Prescott") == 0, "OPENBLAS_CORETYPE=Prescott ran %s", core);
        TEST_EQ_INT(left, 1); /* the user's variable is still there */
    }
    /* nothing set: not weaker than the features allow, nothing more to correct */
    zr_cpu_features f;
    zr_cpu_features_get(&f);
    char fs[128];
    zr_cpu_features_str(&f, fs, sizeof fs);
    if (child_core("", core, &left)) {
        int level = zr_blas_core_level(core), want = zr_blas_core_level(zr_blas_core_for(&f));
        printf("  this CPU (%s): %s kernels\n", fs, core);
        TEST_CHECKF(level < 0 || level >= want, "the BLAS runs %s, weaker than %s (%s) allow", core,
                    zr_blas_core_for(&f), fs);
        TEST_CHECKF(level < 0 || zr_blas_choose(&f, core, NULL, 0, 1, why, sizeof why) == NULL,
                    "%s: %s", core, why);
        TEST_EQ_INT(left, 0); /* zr's OPENBLAS_CORETYPE was removed again */
    }
    /* ZR_CPU=avx2: at most AVX2 kernels, and AVX2's where the CPU has them */
    if (child_core("ZR_CPU=avx2", core, &left)) {
        int level = zr_blas_core_level(core);
        TEST_CHECKF(level <= 2 && (level == 2 || !f.avx2_fma), "ZR_CPU=avx2 ran %s", core);
        TEST_EQ_INT(left, 0);
    }
}

static void test_features_and_cores(void)
{
    zr_cpu_features f;
    zr_cpu_features_get(&f);
    __builtin_cpu_init();
    TEST_EQ_INT(f.avx2_fma, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
    TEST_CHECK(!f.avx512 ||
               (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl")));
    TEST_CHECK(!f.avx512_bf16 || f.avx512);
    cpu_set_t set;
    CPU_ZERO(&set);
    TEST_CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    TEST_EQ_INT(zr_cpu_cores(), CPU_COUNT(&set));
    char buf[256];
    TEST_CHECK(strcmp(zr_cpu_cores_advice(4, 4, buf, sizeof buf), "") == 0);
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_PROCID");
    unsetenv("PMI_RANK");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    zr_cpu_cores_advice(1, 4, buf, sizeof buf);
    TEST_CHECKF(strstr(buf, "--bind-to none") && strstr(buf, "--map-by slot:PE=4"), "%s", buf);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("SLURM_JOB_ID", "7", 1);
    zr_cpu_cores_advice(1, 4, buf, sizeof buf);
    TEST_CHECKF(strstr(buf, "--cpus-per-task=4") != NULL, "%s", buf);
    unsetenv("SLURM_JOB_ID");
    zr_cpu_cores_advice(2, 4, buf, sizeof buf);
    TEST_CHECKF(strstr(buf, "--threads 2") != NULL, "%s", buf);
    const char *isa = NULL;
    double peak = zr_cpu_fma_peak(1, 0.02, 1, &isa);
    TEST_CHECKF(peak > 0 && isa != NULL, "peak %g (%s)", peak, isa != NULL ? isa : "-");
    TEST_CHECK(zr_blas_sgemm_rate(64, 1, 0) > 0 && zr_blas_sgemm_rate(64, 1, 1) > 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--core") == 0) {
        const zr_blas *b = NULL;
        if (zr_blas_load(&b) != ZR_OK) {
            fprintf(stderr, "%s\n", zr_error_message());
            return 1;
        }
        printf("core=%s env_left=%d\n", b->core, getenv("OPENBLAS_CORETYPE") != NULL);
        return 0;
    }
    self = argv[0];
    TEST_RUN(test_choose);
    TEST_RUN(test_processes);
    TEST_RUN(test_features_and_cores);
    return zr_test_finish();
}
