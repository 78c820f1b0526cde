/*
 * test_optim.c - the AdamW and sum-of-squares kernels (zr/optim.h).
 *
 * Every vector path this CPU can run must give the scalar reference's bits,
 * over every length up to 48 and odd lengths around the vector widths (so
 * every tail length of 4, 8 and 16 lanes is hit), at unaligned starts, over
 * several steps, with and without weight decay and gradient scaling, and with
 * zeros, signed zeros, denormals, huge values, infinities and NaNs among the
 * inputs. A path the CPU cannot run is named on stdout and is not registered
 * as a test, so it is never counted as passed. A long update split over 1,
 * 2 and 3 threads gives the same bits too.
 */
#include "test.h"
#include "zr/optim.h"
#include "zr/pool.h"

#include <float.h>

#define MAXN 4200
#define PAD  4

static uint32_t f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static uint64_t d2u(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* Same bits, or both NaN (a NaN's payload may follow operand order). */
static int same(float a, float b)
{
    return f2u(a) == f2u(b) || (isnan(a) && isnan(b));
}

static const size_t lengths[] = {63,  64,   65,   127,  129,  255,  257,  511, 513,
                                 999, 1023, 1025, 2047, 2049, 4095, 4097, 4111};

/* The lengths tried: 0..48, then the list above. */
static size_t length_at(int i)
{
    return i <= 48 ? (size_t)i : lengths[i - 49];
}

static int n_lengths(void)
{
    return 49 + (int)(sizeof lengths / sizeof lengths[0]);
}

typedef struct state {
    float p[MAXN + PAD], g[MAXN + PAD], m[MAXN + PAD], v[MAXN + PAD];
} state;

static state ref_state, vec_state;

/* Random inputs; with specials != 0 some elements are the awkward values. */
static void fill(state *s, zr_test_rng *r, int specials)
{
    static const float odd[] = {0.0f,   -0.0f,  1e-40f,   -1e-40f,   FLT_MIN, 1e30f,
                                -1e30f, 1e-30f, INFINITY, -INFINITY, NAN};
    int nodd = (int)(sizeof odd / sizeof odd[0]);
    for (int i = 0; i < MAXN + PAD; i++) {
        s->p[i] = zr_test_rng_uniform(r);
        s->g[i] = zr_test_rng_uniform(r) * 0.01f;
        s->m[i] = zr_test_rng_uniform(r) * 0.001f;
        s->v[i] = fabsf(zr_test_rng_uniform(r)) * 1e-5f;
        if (specials && zr_test_rng_next(r) % 7 == 0) {
            s->g[i] = odd[zr_test_rng_next(r) % (uint64_t)nodd];
        }
        if (specials && zr_test_rng_next(r) % 11 == 0) {
            s->p[i] = odd[zr_test_rng_next(r) % (uint64_t)(nodd - 3)]; /* finite ones */
        }
    }
}

/* Index of the first element where the two states differ, or -1. */
static long first_diff(size_t off, size_t n)
{
    for (size_t i = off; i < off + n; i++) {
        if (!same(ref_state.p[i], vec_state.p[i]) || !same(ref_state.m[i], vec_state.m[i]) ||
            !same(ref_state.v[i], vec_state.v[i])) {
            return (long)i;
        }
    }
    return -1;
}

static void check_adamw(zr_optim_impl impl)
{
    zr_test_rng r = {0x5eed0000u + (uint64_t)impl};
    zr_adamw h = zr_adamw_default();
    static const float scales[] = {1.0f, 0.37f};
    static const int first_t[] = {1, 999};
    int cases = 0;
    for (int li = 0; li < n_lengths(); li++) {
        size_t n = length_at(li);
        for (size_t off = 0; off < PAD; off++) {
            for (int variant = 0; variant < 8; variant++) {
                int decay = variant & 1;
                float gs = scales[(variant >> 1) & 1];
                int t0 = first_t[(variant >> 2) & 1];
                fill(&ref_state, &r, variant % 3 == 0);
                vec_state = ref_state;
                /* three steps on the same buffers: the moments evolve */
                for (int t = t0; t < t0 + 3; t++) {
                    float lr = 1e-3f / (float)t;
                    TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_SCALAR));
                    zr_adamw_update(&h, lr, t, gs, decay, ref_state.p + off, ref_state.g + off,
                                    ref_state.m + off, ref_state.v + off, n);
                    TEST_OK(zr_optim_set_impl(impl));
                    zr_adamw_update(&h, lr, t, gs, decay, vec_state.p + off, vec_state.g + off,
                                    vec_state.m + off, vec_state.v + off, n);
                    long d = first_diff(0, MAXN + PAD);
                    TEST_CHECKF(d < 0,
                                "%s: n %zu offset %zu decay %d scale %g t %d: element %ld "
                                "p %08x vs %08x, m %08x vs %08x, v %08x vs %08x",
                                zr_optim_impl_name(impl), n, off, decay, (double)gs, t, d,
                                d < 0 ? 0 : f2u(ref_state.p[d]), d < 0 ? 0 : f2u(vec_state.p[d]),
                                d < 0 ? 0 : f2u(ref_state.m[d]), d < 0 ? 0 : f2u(vec_state.m[d]),
                                d < 0 ? 0 : f2u(ref_state.v[d]), d < 0 ? 0 : f2u(vec_state.v[d]));
                    if (d >= 0) {
                        TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_AUTO));
                        return; /* one report per path is enough */
                    }
                    cases++;
                }
            }
        }
    }
    TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_AUTO));
    TEST_CHECK(cases == n_lengths() * PAD * 8 * 3);
}

static void check_sumsq(zr_optim_impl impl)
{
    zr_test_rng r = {0xabc00000u + (uint64_t)impl};
    for (int li = 0; li < n_lengths(); li++) {
        size_t n = length_at(li);
        for (size_t off = 0; off < PAD; off++) {
            fill(&ref_state, &r, off == 3);
            TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_SCALAR));
            double a = zr_sumsq(ref_state.p + off, n);
            double b = zr_sumsq(ref_state.g + off, n);
            TEST_OK(zr_optim_set_impl(impl));
            double va = zr_sumsq(ref_state.p + off, n);
            double vb = zr_sumsq(ref_state.g + off, n);
            TEST_CHECKF(d2u(a) == d2u(va), "%s: sumsq of p, n %zu offset %zu: %.17g vs %.17g",
                        zr_optim_impl_name(impl), n, off, a, va);
            TEST_CHECKF(d2u(b) == d2u(vb) || (isnan(b) && isnan(vb)),
                        "%s: sumsq of g, n %zu offset %zu: %.17g vs %.17g",
                        zr_optim_impl_name(impl), n, off, b, vb);
        }
    }
    TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_AUTO));
}

static void test_sse2_matches_scalar(void)
{
    check_adamw(ZR_OPTIM_IMPL_SSE2);
    check_sumsq(ZR_OPTIM_IMPL_SSE2);
}

static void test_avx2_matches_scalar(void)
{
    check_adamw(ZR_OPTIM_IMPL_AVX2);
    check_sumsq(ZR_OPTIM_IMPL_AVX2);
}

static void test_avx512_matches_scalar(void)
{
    check_adamw(ZR_OPTIM_IMPL_AVX512);
    check_sumsq(ZR_OPTIM_IMPL_AVX512);
}

/* The reference itself is AdamW: one step from zero moments, by hand. */
static void test_scalar_is_adamw(void)
{
    TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_SCALAR));
    zr_adamw h = zr_adamw_default();
    float p[3] = {0.5f, -0.25f, 2.0f}, g[3] = {0.02f, -0.5f, 0.0f}, m[3] = {0}, v[3] = {0};
    zr_adamw_update(&h, 1e-2f, 1, 2.0f, 1, p, g, m, v, 3);
    float p0[3] = {0.5f, -0.25f, 2.0f};
    for (int i = 0; i < 3; i++) {
        double gi = 2.0 * (double)g[i];
        double mhat = gi, vhat = gi * gi; /* bias correction cancels (1 - beta) at t = 1 */
        double want = p0[i] - 1e-2 * (mhat / (sqrt(vhat) + 1e-8) + 0.1 * p0[i]);
        TEST_NEAR(p[i], want, 1e-6);
        TEST_NEAR(m[i], 0.1 * gi, 1e-7);
        TEST_NEAR(v[i], 0.05 * gi * gi, 1e-7);
    }
    TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_AUTO));
}

/*
 * The update split over the process's pool: lengths that leave ragged
 * blocks and ragged thread ranges, at an unaligned start, same bits at 1, 2
 * and 3 threads (and two steps, so the moments carry over).
 */
static void test_threads_same_bits(void)
{
    enum { N = 300001 };
    static float p[3][N + 1], g[N + 1], m[3][N + 1], v[3][N + 1];
    zr_test_rng r = {0x7e4d};
    for (size_t i = 0; i <= N; i++) {
        g[i] = zr_test_rng_normal(&r) * 0.01f;
        p[0][i] = p[1][i] = p[2][i] = zr_test_rng_uniform(&r);
        m[0][i] = m[1][i] = m[2][i] = 0.0f;
        v[0][i] = v[1][i] = v[2][i] = 0.0f;
    }
    zr_adamw h = zr_adamw_default();
    const size_t lengths[] = {N, 70000, 65537};
    for (int k = 0; k < 3; k++) {
        TEST_OK(zr_threads_set(k + 1));
        for (int li = 0; li < 3; li++) {
            for (int t = 1; t <= 2; t++) {
                zr_adamw_update(&h, 1e-3f, t, 1.0f, li & 1, p[k] + 1, g + 1, m[k] + 1, v[k] + 1,
                                lengths[li] - 1);
            }
        }
    }
    TEST_OK(zr_threads_set(1));
    for (int k = 1; k < 3; k++) {
        TEST_CHECKF(memcmp(p[k], p[0], sizeof p[0]) == 0 && memcmp(m[k], m[0], sizeof m[0]) == 0 &&
                        memcmp(v[k], v[0], sizeof v[0]) == 0,
                    "%d threads: the update differs from 1 thread", k + 1);
    }
}

/* AUTO is the widest runnable path; unknown and unrunnable choices are refused. */
static void test_impl_choice(void)
{
    static const zr_optim_impl all[] = {ZR_OPTIM_IMPL_SCALAR, ZR_OPTIM_IMPL_SSE2,
                                        ZR_OPTIM_IMPL_AVX2, ZR_OPTIM_IMPL_AVX512};
    zr_optim_impl widest = ZR_OPTIM_IMPL_SCALAR;
    for (int i = 0; i < 4; i++) {
        zr_error_clear();
        if (zr_optim_set_impl(all[i]) == ZR_OK) {
            TEST_EQ_INT(zr_optim_get_impl(), all[i]);
            widest = all[i];
        } else {
            TEST_CHECKF(strstr(zr_error_message(), "this CPU cannot run") != NULL &&
                            strstr(zr_error_message(), zr_optim_impl_name(all[i])) != NULL,
                        "refusal of %s: \"%s\"", zr_optim_impl_name(all[i]), zr_error_message());
        }
    }
    TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_AUTO));
    TEST_EQ_INT(zr_optim_get_impl(), widest);
    TEST_FAILS(zr_optim_set_impl((zr_optim_impl)42), ZR_ERR_INVALID, "unknown implementation 42");
    TEST_FAILS(zr_optim_set_impl((zr_optim_impl)-1), ZR_ERR_INVALID, "unknown implementation -1");
    TEST_EQ_INT(zr_optim_get_impl(), widest);
}

int main(void)
{
    TEST_RUN(test_scalar_is_adamw);
    TEST_RUN(test_impl_choice);
    TEST_RUN(test_threads_same_bits);

    struct {
        zr_optim_impl impl;
        void (*fn)(void);
        const char *name;
    } paths[] = {
        {ZR_OPTIM_IMPL_SSE2, test_sse2_matches_scalar, "test_sse2_matches_scalar"},
        {ZR_OPTIM_IMPL_AVX2, test_avx2_matches_scalar, "test_avx2_matches_scalar"},
        {ZR_OPTIM_IMPL_AVX512, test_avx512_matches_scalar, "test_avx512_matches_scalar"},
    };
    char ran[64] = "scalar", skipped[64] = "";
    for (int i = 0; i < 3; i++) {
        const char *name = zr_optim_impl_name(paths[i].impl);
        if (zr_optim_set_impl(paths[i].impl) == ZR_OK) {
            zr_test_run_(paths[i].name, paths[i].fn);
            snprintf(ran + strlen(ran), sizeof ran - strlen(ran), " %s", name);
        } else {
            printf("skip %s: this CPU cannot run %s (not counted as passed)\n", paths[i].name,
                   name);
            snprintf(skipped + strlen(skipped), sizeof skipped - strlen(skipped), " %s", name);
        }
    }
    zr_error_clear();
    zr_optim_set_impl(ZR_OPTIM_IMPL_AUTO);
    printf("optim paths run: %s; not run on this CPU:%s\n", ran,
           skipped[0] != '\0' ? skipped : " none");
    return zr_test_finish();
}
