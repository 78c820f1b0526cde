/*
 * test_quant.c - the block quantization codecs (zr/quant.h).
 *
 * Property tests over random and adversarial data: the per-element error
 * bound of quant.h, exact round trips of representable values, every vector
 * implementation equal to the scalar oracle bit for bit (blocks, residuals,
 * decoded fp32/bf16, decode_add, sum_requant), bf16 conversion, non-finite
 * groups, rejection of bad headers field by field, and the same bits at 1, 2
 * and 3 threads (run under ThreadSanitizer too: the emu-tsan suite).
 *
 * The full sweep runs in every build (about 2 s under ASan), so nothing is
 * thinned for the sanitizers.
 */
#include "test.h"
#include "zr/pool.h"
#include "zr/quant.h"

#include "../src/quant/quant_rules.h" /* zr_quant_rcp_refine, the GPU reciprocal under test */

#include <float.h>

static uint32_t f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The implementations this CPU can run, scalar first (the oracle). */
static int impls(zr_quant_impl *out)
{
    int n = 0;
    zr_quant_impl all[] = {ZR_QUANT_IMPL_SCALAR, ZR_QUANT_IMPL_AVX2, ZR_QUANT_IMPL_AVX512};
    for (int i = 0; i < 3; i++) {
        if (zr_quant_set_impl(all[i]) == ZR_OK) {
            out[n++] = all[i];
        }
    }
    zr_error_clear();
    zr_quant_set_impl(ZR_QUANT_IMPL_AUTO);
    return n;
}

/* ---- data --------------------------------------------------------------- */

enum {
    D_GAUSS,
    D_UNIFORM,
    D_CONST,    /* every group constant (positive and negative) */
    D_OUTLIER,  /* small noise plus one huge value per group */
    D_DENORMAL, /* only subnormal values */
    D_ZERO,
    D_NEGATIVE,
    D_WIDE, /* group magnitudes from 1e-30 to 1e30 */
    D_TIES, /* exact halves of the step: round-half-even decides */
    D_COUNT
};

static const char *const data_names[D_COUNT] = {"gauss", "uniform",  "const", "outlier", "denorm",
                                                "zero",  "negative", "wide",  "ties"};

static void fill(int kind, zr_test_rng *rng, float *x, size_t n, size_t group)
{
    for (size_t i = 0; i < n; i++) {
        size_t gi = i / group;
        float u = zr_test_rng_uniform(rng);
        switch (kind) {
        case D_GAUSS:
            x[i] = zr_test_rng_normal(rng);
            break;
        case D_UNIFORM:
            x[i] = u * 3.0f;
            break;
        case D_CONST:
            x[i] = (gi % 2 ? -1.0f : 1.0f) * (float)(gi + 1) * 0.37f;
            break;
        case D_OUTLIER:
            x[i] = i % group == (gi * 7) % group ? 1e6f : u * 1e-3f;
            break;
        case D_DENORMAL:
            /* odd groups so small that absmax / 2^(b-1) underflows to 0 */
            x[i] = u * (gi % 2 ? 3e-44f : 1e-39f);
            break;
        case D_ZERO:
            x[i] = (i & 1) ? -0.0f : 0.0f;
            break;
        case D_NEGATIVE:
            x[i] = -fabsf(u) - 1e-3f;
            break;
        case D_WIDE:
            x[i] = u * powf(10.0f, (float)((int)(gi % 13) * 5 - 30));
            break;
        case D_TIES:
            /* with one element at -8 the 4-bit scale is 1 (8-bit: 1/16), so
             * k + 0.5 are ties in both */
            x[i] = i % group == 0 ? -8.0f : (float)((int)(u * 7.0f)) + 0.5f;
            break;
        }
    }
}

/* ---- the oracle checks ---------------------------------------------------- */

static float scale_of(const uint8_t *block, const zr_quant_params *p, size_t gi, float *zero)
{
    float s;
    size_t idx = p->scheme == ZR_QUANT_ASYM ? 2 * gi : gi;
    memcpy(&s, block + 32 + idx * 4, 4);
    *zero = 0.0f;
    if (p->scheme == ZR_QUANT_ASYM) {
        memcpy(zero, block + 32 + (idx + 1) * 4, 4);
    }
    return s;
}

/* Check |v - x'| against the bound of quant.h for every element of finite groups. */
static int check_bound(const zr_quant_params *p, const uint8_t *block, const float *v,
                       const float *dq, size_t n)
{
    int bad = 0;
    double half = (double)(1 << (p->bits - 1));
    double tiny = ldexp(1.0, p->bits - 149); /* slack for subnormal scales */
    for (size_t i = 0; i < n && bad < 5; i++) {
        float zero, s = scale_of(block, p, i / (size_t)p->group, &zero);
        if (isnan(s)) {
            continue;
        }
        double err = fabs((double)v[i] - (double)dq[i]);
        double bound;
        if (p->scheme == ZR_QUANT_SYM) {
            bound = (double)v[i] > (half - 0.5) * s ? s : s / 2.0;
            bound = bound * (1 + 0x1p-15) + tiny; /* rounding of q * scale */
        } else {
            bound = s / 2.0 * (1 + 0x1p-15) + tiny +
                    (fabs(v[i]) + fabs(zero) + fabs(dq[i])) * ldexp(1.0, -22);
        }
        if (!(err <= bound)) {
            bad++;
            TEST_CHECKF(0, "bits %d %s G %d i %zu: x %.9g x' %.9g err %.3g > bound %.3g (scale %g)",
                        p->bits, p->scheme == ZR_QUANT_SYM ? "sym" : "asym", p->group, i, v[i],
                        dq[i], err, bound, s);
        }
    }
    return bad == 0;
}

/*
 * Encode x (n values of type t) with every implementation, with mul and an
 * optional residual, and check: blocks, residuals and counts equal to the
 * oracle bit for bit; every decode mode equal too; the error bound; and the
 * residual equal to v - x'.
 */
static void check_all(const zr_quant_params *p, zr_dtype t, const float *xf, size_t n, float mul,
                      const float *res_in, size_t *nonfinite_out)
{
    zr_quant_impl im[3];
    int ni = impls(im);
    size_t bytes = zr_quant_block_bytes(p, n);
    TEST_CHECK(bytes % 4 == 0);
    size_t nn = n ? n : 1;
    uint8_t *ref = malloc(bytes), *blk = malloc(bytes);
    zr_bf16 *xh = malloc(nn * 2);
    float *v = malloc(nn * 4), *r_ref = malloc(nn * 4), *r = malloc(nn * 4);
    float *dq_ref = malloc(nn * 4), *dq = malloc(nn * 4);
    zr_bf16 *dh_ref = malloc(nn * 2), *dh = malloc(nn * 2);
    float *acc0 = malloc(nn * 4), *acc_ref = malloc(nn * 4), *acc = malloc(nn * 4);
    const void *x = xf;
    if (t == ZR_DTYPE_BF16) {
        zr_bf16_from_f32_n(xh, xf, n);
        x = xh;
    }
    for (size_t i = 0; i < n; i++) {
        float xi = t == ZR_DTYPE_BF16 ? zr_bf16_to_f32(xh[i]) : xf[i];
        v[i] = xi * mul;
        if (res_in != NULL) {
            v[i] = v[i] + res_in[i];
        }
        acc0[i] = (float)(i % 17) - 8.25f;
    }
    size_t nf_ref = 0;
    for (int k = 0; k < ni; k++) {
        TEST_OK(zr_quant_set_impl(im[k]));
        uint8_t *b = k == 0 ? ref : blk;
        float *rr = k == 0 ? r_ref : r;
        memset(b, k == 0 ? 0xa5 : 0x5a, bytes); /* every byte must be written */
        if (res_in != NULL) {
            memcpy(rr, res_in, n * 4);
        }
        size_t nf = 0;
        TEST_OK(zr_quant_encode(p, t, x, n, mul, res_in ? rr : NULL, b, &nf));
        TEST_OK(zr_quant_validate(b, bytes, p, n));
        float *d = k == 0 ? dq_ref : dq;
        zr_bf16 *h = k == 0 ? dh_ref : dh;
        float *a = k == 0 ? acc_ref : acc;
        memcpy(a, acc0, n * 4);
        /* decode the oracle's block, so decoders are compared on equal input */
        TEST_OK(zr_quant_decode(ref, ZR_DTYPE_F32, d, n));
        TEST_OK(zr_quant_decode(ref, ZR_DTYPE_BF16, h, n));
        TEST_OK(zr_quant_decode_add(ref, a, n));
        if (k == 0) {
            /* the oracle's own decode modes agree with the element rules */
            int ok = 1;
            for (size_t i = 0; i < n; i++) {
                float sum = acc0[i] + d[i];
                ok &= h[i] == zr_bf16_from_f32(d[i]) && f2u(a[i]) == f2u(sum);
            }
            TEST_CHECKF(ok, "bf16 decode or decode_add disagree with fp32 decode");
            nf_ref = nf;
            continue;
        }
        const char *name = zr_quant_impl_name(im[k]);
        TEST_CHECKF(nf == nf_ref, "%s nonfinite %zu vs %zu", name, nf, nf_ref);
        TEST_CHECKF(memcmp(ref, blk, bytes) == 0, "%s block differs (bits %d %s G %d n %zu %s)",
                    name, p->bits, p->scheme ? "asym" : "sym", p->group, n, zr_dtype_name(t));
        if (res_in != NULL) {
            TEST_CHECKF(memcmp(r_ref, r, n * 4) == 0, "%s residual differs", name);
        }
        TEST_CHECKF(memcmp(dq_ref, dq, n * 4) == 0, "%s fp32 decode differs", name);
        TEST_CHECKF(memcmp(dh_ref, dh, n * 2) == 0, "%s bf16 decode differs", name);
        TEST_CHECKF(memcmp(acc_ref, acc, n * 4) == 0, "%s decode_add differs", name);
    }
    zr_quant_set_impl(ZR_QUANT_IMPL_AUTO);
    check_bound(p, ref, v, dq_ref, n);
    if (res_in != NULL) {
        int ok = 1;
        for (size_t i = 0; i < n; i++) {
            float zero, s = scale_of(ref, p, i / (size_t)p->group, &zero);
            float want = isnan(s) ? 0.0f : v[i] - dq_ref[i];
            ok &= f2u(r_ref[i]) == f2u(want);
        }
        TEST_CHECKF(ok, "residual != v - x'");
    }
    if (nonfinite_out != NULL) {
        *nonfinite_out = nf_ref;
    }
    free(ref);
    free(blk);
    free(xh);
    free(v);
    free(r_ref);
    free(r);
    free(dq_ref);
    free(dq);
    free(dh_ref);
    free(dh);
    free(acc0);
    free(acc_ref);
    free(acc);
}

/* ---- tests ----------------------------------------------------------------- */

static void test_params_and_sizes(void)
{
    zr_quant_params p = {8, 256, ZR_QUANT_SYM};
    TEST_OK(zr_quant_params_check(&p));
    zr_quant_params bad = p;
    bad.bits = 6;
    TEST_FAILS(zr_quant_params_check(&bad), ZR_ERR_INVALID, "bits");
    bad = p;
    bad.group = 36;
    TEST_FAILS(zr_quant_params_check(&bad), ZR_ERR_INVALID, "group");
    bad.group = 24;
    TEST_FAILS(zr_quant_params_check(&bad), ZR_ERR_INVALID, "group");
    bad.group = 65536 + 8;
    TEST_FAILS(zr_quant_params_check(&bad), ZR_ERR_INVALID, "group");
    bad = p;
    bad.scheme = (zr_quant_scheme)7;
    TEST_FAILS(zr_quant_params_check(&bad), ZR_ERR_INVALID, "scheme");
    p.group = 32;
    TEST_OK(zr_quant_params_check(&p));
    p.group = 65536;
    TEST_OK(zr_quant_params_check(&p));
    p.group = ZR_QUANT_DEFAULT_GROUP;
    TEST_OK(zr_quant_params_check(&p));

    zr_quant_params q8 = {8, 32, ZR_QUANT_SYM}, q4 = {4, 32, ZR_QUANT_SYM},
                    a4 = {4, 32, ZR_QUANT_ASYM};
    TEST_EQ_INT(zr_quant_block_bytes(&q8, 0), 32);
    TEST_EQ_INT(zr_quant_block_bytes(&q8, 1), 32 + 4 + 4);
    TEST_EQ_INT(zr_quant_block_bytes(&q8, 33), 32 + 8 + 36);
    TEST_EQ_INT(zr_quant_block_bytes(&q4, 33), 32 + 8 + 20);
    TEST_EQ_INT(zr_quant_block_bytes(&a4, 64), 32 + 16 + 32);
    TEST_EQ_INT(zr_dtype_size(ZR_DTYPE_BF16), 2);
    TEST_CHECK(strcmp(zr_dtype_name(ZR_DTYPE_F32), "fp32") == 0);
}

static void test_impl_select(void)
{
    TEST_OK(zr_quant_set_impl(ZR_QUANT_IMPL_SCALAR));
    TEST_EQ_INT(zr_quant_get_impl(), ZR_QUANT_IMPL_SCALAR);
    TEST_FAILS(zr_quant_set_impl((zr_quant_impl)42), ZR_ERR_INVALID, "impl");
    TEST_OK(zr_quant_set_impl(ZR_QUANT_IMPL_AUTO));
    zr_quant_impl im[3];
    int n = impls(im);
    TEST_EQ_INT(zr_quant_get_impl(), im[n - 1]); /* auto = the best one */
    printf("  implementations:");
    for (int i = 0; i < n; i++) {
        printf(" %s", zr_quant_impl_name(im[i]));
    }
    printf(" (auto = %s)\n", zr_quant_impl_name(zr_quant_get_impl()));
#if defined(__x86_64__)
    if (zr_cpu_cap() >= ZR_CPU_AVX512 && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
        TEST_EQ_INT(n, 3); /* on this CI machine the vector paths must be tested */
    }
#endif
}

/* Reference rounding in double: nearest bf16, ties to the even mantissa. */
static uint16_t bf16_ref(uint32_t u)
{
    float x = u2f(u);
    if (isnan(x)) {
        return (uint16_t)((u >> 16) | 0x40);
    }
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    double dl = fabs((double)x - (double)u2f(lo));
    /* hi may be the Inf pattern: overflow past the largest finite bf16 */
    double dh = (hi & 0x7fffffffu) == 0x7f800000u
                    ? fabs((double)x - ldexp(1.0, 128) * (x < 0 ? -1 : 1))
                    : fabs((double)x - (double)u2f(hi));
    if (dl < dh || (dl == dh && ((lo >> 16) & 1) == 0)) {
        return (uint16_t)(lo >> 16);
    }
    return (uint16_t)(hi >> 16);
}

static void test_bf16(void)
{
    TEST_EQ_INT(zr_bf16_from_f32(1.0f), 0x3f80);
    TEST_EQ_INT(zr_bf16_from_f32(-2.0f), 0xc000);
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0x3f808000u)), 0x3f80); /* tie, even below */
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0x3f818000u)), 0x3f82); /* tie, even above */
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0x3f808001u)), 0x3f81);
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0x3f807fffu)), 0x3f80);
    TEST_EQ_INT(zr_bf16_from_f32(INFINITY), 0x7f80);
    TEST_EQ_INT(zr_bf16_from_f32(-INFINITY), 0xff80);
    TEST_EQ_INT(zr_bf16_from_f32(FLT_MAX), 0x7f80); /* overflow rounds to Inf */
    TEST_EQ_INT(zr_bf16_from_f32(-FLT_MAX), 0xff80);
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0x7f7f7fffu)), 0x7f7f); /* largest bf16 stays finite */
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0x7f7f8000u)), 0x7f80); /* tie to even = Inf */
    TEST_EQ_INT(zr_bf16_from_f32(-0.0f), 0x8000);
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0x00008000u)), 0x0000); /* subnormal tie, even */
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0x00018000u)), 0x0002);
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0x007fffffu)), 0x0080); /* rounds up into the normals */
    uint16_t qn = zr_bf16_from_f32(NAN);
    TEST_CHECK(isnan(zr_bf16_to_f32(qn)) && (qn & 0x40));
    uint16_t sn = zr_bf16_from_f32(u2f(0x7f800001u)); /* signaling, payload only in low bits */
    TEST_CHECK(isnan(zr_bf16_to_f32(sn)) && sn == 0x7fc0);
    TEST_EQ_INT(zr_bf16_from_f32(u2f(0xffc12345u)), 0xffc1); /* sign kept */
    TEST_CHECK(zr_bf16_to_f32(0x3f80) == 1.0f);
    TEST_CHECK(f2u(zr_bf16_to_f32(0x8001)) == 0x80010000u);

    /* every bf16 survives a round trip; every NaN stays NaN */
    int ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = zr_bf16_to_f32((zr_bf16)h);
        uint16_t back = zr_bf16_from_f32(f);
        ok &= isnan(f) ? isnan(zr_bf16_to_f32(back)) : back == h;
    }
    TEST_CHECK(ok);
    /* random bit patterns against the double reference, and the _n versions */
    zr_test_rng rng = {12345};
    size_t n = 1 << 20;
    float *f = malloc(n * 4), *w = malloc(n * 4);
    zr_bf16 *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        f[i] = u2f((uint32_t)zr_test_rng_next(&rng));
    }
    zr_bf16_from_f32_n(h, f, n);
    zr_bf16_to_f32_n(w, h, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = bf16_ref(f2u(f[i]));
        if (h[i] != want || h[i] != zr_bf16_from_f32(f[i]) || f2u(w[i]) != (uint32_t)h[i] << 16) {
            if (bad++ < 5) {
                TEST_CHECKF(0, "bf16(0x%08x) = 0x%04x, want 0x%04x", f2u(f[i]), h[i], want);
            }
        }
    }
    TEST_EQ_INT(bad, 0);
    free(f);
    free(w);
    free(h);
}

/* Values q * scale come back exactly, in every scheme and bit width. */
static void test_exact_roundtrip(void)
{
    zr_test_rng rng = {77};
    for (int bits = 4; bits <= 8; bits += 4) {
        for (int scheme = 0; scheme < 2; scheme++) {
            zr_quant_params p = {bits, 64, (zr_quant_scheme)scheme};
            size_t n = 64 * 5 + 24;
            float *x = malloc(n * 4), *y = malloc(n * 4);
            int qmin = scheme ? 0 : -(1 << (bits - 1)),
                qmax = scheme ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
            for (size_t i = 0; i < n; i++) {
                size_t gi = i / 64;
                float s = ldexpf(1.0f, (int)gi * 3 - 7);
                float zero = scheme ? -37.0f * s : 0.0f;
                int q = qmin + (int)(zr_test_rng_next(&rng) % (uint64_t)(qmax - qmin + 1));
                if (i % 64 == 0) {
                    q = qmin; /* pins absmax (sym) and min (asym) */
                } else if (i % 64 == 1 && scheme) {
                    q = qmax; /* pins max (asym) */
                }
                x[i] = zero + (float)q * s;
            }
            uint8_t *b = malloc(zr_quant_block_bytes(&p, n));
            zr_quant_impl im[3];
            int ni = impls(im);
            for (int k = 0; k < ni; k++) {
                zr_quant_set_impl(im[k]);
                TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, n, 1.0f, NULL, b, NULL));
                TEST_OK(zr_quant_decode(b, ZR_DTYPE_F32, y, n));
                TEST_CHECKF(memcmp(x, y, n * 4) == 0, "bits %d scheme %d %s: not exact", bits,
                            scheme, zr_quant_impl_name(im[k]));
            }
            zr_quant_set_impl(ZR_QUANT_IMPL_AUTO);
            free(x);
            free(y);
            free(b);
        }
    }
}

/* Every data kind, bits, scheme, input type, at several group sizes. */
static void test_properties(void)
{
    static const int groups[] = {32, 40, 256, 2048, 65536};
    zr_test_rng rng = {2024};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        int G = groups[gi];
        size_t n = (size_t)G * 3 + 7;
        float *x = malloc(n * 4), *r = malloc(n * 4);
        for (int kind = 0; kind < D_COUNT; kind++) {
            fill(kind, &rng, x, n, (size_t)G);
            for (int bits = 4; bits <= 8; bits += 4) {
                for (int scheme = 0; scheme < 2; scheme++) {
                    for (int t = 0; t < 2; t++) {
                        zr_quant_params p = {bits, G, (zr_quant_scheme)scheme};
                        int before = zr_test_failed_checks;
                        check_all(&p, (zr_dtype)t, x, n, 1.0f, NULL, NULL);
                        /* with mul and residual too */
                        for (size_t i = 0; i < n; i++) {
                            r[i] = zr_test_rng_uniform(&rng) * 0.01f;
                        }
                        check_all(&p, (zr_dtype)t, x, n, 0.125f + (float)kind, r, NULL);
                        if (zr_test_failed_checks != before) {
                            printf("  (failed on data %s bits %d %s G %d %s)\n", data_names[kind],
                                   bits, scheme ? "asym" : "sym", G, zr_dtype_name((zr_dtype)t));
                        }
                    }
                }
            }
        }
        free(x);
        free(r);
    }
}

/* Every length 1..3G+7 for small groups: partial groups, odd 4-bit tails. */
static void test_lengths(void)
{
    zr_test_rng rng = {99};
    static const int groups[] = {32, 64};
    for (size_t gi = 0; gi < 2; gi++) {
        int G = groups[gi];
        size_t maxn = (size_t)G * 3 + 7;
        float *x = malloc(maxn * 4), *r = malloc(maxn * 4);
        fill(D_GAUSS, &rng, x, maxn, (size_t)G);
        for (size_t i = 0; i < maxn; i++) {
            r[i] = zr_test_rng_uniform(&rng) * 0.1f;
        }
        for (size_t n = 1; n <= maxn; n++) {
            for (int bits = 4; bits <= 8; bits += 4) {
                for (int scheme = 0; scheme < 2; scheme++) {
                    zr_quant_params p = {bits, G, (zr_quant_scheme)scheme};
                    check_all(&p, (zr_dtype)(n & 1), x, n, 1.0f, (n % 4 == 0) ? r : NULL, NULL);
                }
            }
        }
        free(x);
        free(r);
    }
    /* the largest group with lengths around its edges */
    static const size_t big[] = {1, 15, 17, 65535, 65536, 65537, 3 * 65536 + 7};
    float *x = malloc(big[6] * 4);
    fill(D_UNIFORM, &rng, x, big[6], 65536);
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        zr_quant_params p = {(int)(i % 2 ? 4 : 8), 65536, ZR_QUANT_SYM};
        check_all(&p, ZR_DTYPE_F32, x, big[i], 1.0f, NULL, NULL);
    }
    free(x);
    /* count 0 is a valid, header-only block */
    zr_quant_params p = {8, 32, ZR_QUANT_SYM};
    uint8_t b[64];
    TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, NULL, 0, 1.0f, NULL, b, NULL));
    TEST_OK(zr_quant_validate(b, zr_quant_block_bytes(&p, 0), &p, 0));
    TEST_EQ_INT(zr_quant_block_count(b), 0);
}

static void test_zero_and_constant(void)
{
    /* absmax 0: scale 0 and exact zeros, never NaN */
    zr_quant_params p = {4, 32, ZR_QUANT_SYM};
    float x[40], y[40];
    for (int i = 0; i < 40; i++) {
        x[i] = (i & 1) ? -0.0f : 0.0f;
    }
    uint8_t b[256];
    TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, 40, 1.0f, NULL, b, NULL));
    float zero, s = scale_of(b, &p, 0, &zero);
    TEST_CHECK(s == 0.0f && !isnan(s));
    TEST_OK(zr_quant_decode(b, ZR_DTYPE_F32, y, 40));
    int ok = 1;
    for (int i = 0; i < 40; i++) {
        ok &= y[i] == 0.0f && !isnan(y[i]);
    }
    TEST_CHECK(ok);
    /* +absmax clamps to 2^(b-1)-1, -absmax is exact */
    for (int i = 0; i < 40; i++) {
        x[i] = i % 2 ? 3.0f : -3.0f;
    }
    TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, 40, 1.0f, NULL, b, NULL));
    TEST_OK(zr_quant_decode(b, ZR_DTYPE_F32, y, 40));
    TEST_CHECK(y[0] == -3.0f && y[1] == 3.0f * 7.0f / 8.0f);
    /* asymmetric: a constant group is exact */
    p.scheme = ZR_QUANT_ASYM;
    TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x + 1, 1, 1.0f, NULL, b, NULL));
    TEST_OK(zr_quant_decode(b, ZR_DTYPE_F32, y, 1));
    TEST_CHECK(y[0] == 3.0f);
    /* a scale that underflows to 0 decodes to zeros, never NaN or Inf */
    p.scheme = ZR_QUANT_SYM;
    p.bits = 8;
    for (int i = 0; i < 32; i++) {
        x[i] = u2f((uint32_t)(i % 20)); /* 0 .. 19 * 2^-149 */
    }
    TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, 32, 1.0f, NULL, b, NULL));
    s = scale_of(b, &p, 0, &zero);
    TEST_CHECK(s == 0.0f);
    TEST_OK(zr_quant_decode(b, ZR_DTYPE_F32, y, 32));
    ok = 1;
    for (int i = 0; i < 32; i++) {
        ok &= y[i] == 0.0f;
    }
    TEST_CHECK(ok);
}

/*
 * zr_quant_rcp_refine (quant_rules.h), the GPU's reciprocal: from a start a
 * few ulps off, it gives the correctly rounded 1/d for every significand
 * (all 2^23 in [1, 2), the ratio is the same at every exponent) and at
 * random normal d of every exponent the rule uses.
 */
static void test_rcp_refine(void)
{
    long bad = 0;
    for (uint32_t m = 0; m < (1u << 23); m++) {
        float d = u2f(0x3f800000u | m), want = 1.0f / d;
        for (int k = -3; k <= 3; k += 2) {
            uint32_t y = f2u(want) + (uint32_t)k;
            bad += zr_quant_rcp_refine(d, u2f(y)) != want;
        }
    }
    zr_test_rng rng = {77};
    for (int i = 0; i < 200000; i++) {
        uint64_t x = zr_test_rng_next(&rng);
        uint32_t e = 1 + (uint32_t)(x % 251); /* 2^-126 .. 2^124 */
        float d = u2f(e << 23 | (uint32_t)(x >> 41));
        float want = 1.0f / d;
        bad += zr_quant_rcp_refine(d, u2f(f2u(want) + 1u)) != want;
        bad += zr_quant_rcp_refine(d, u2f(f2u(want) - 1u)) != want;
    }
    TEST_EQ_INT(bad, 0);
}

/*
 * The rule of issue 42 (quant_rules.h): q = round(v * inv), inv = 1/div once
 * per group, not round(v / div). Known answers where the two differ, on
 * every implementation, with the residual of error feedback; and a group too
 * small for a finite reciprocal (1/div = Inf), coded as (v * 2^64) * inv.
 */
static void test_reciprocal_rule(void)
{
    zr_quant_impl im[3];
    int nim = impls(im);
    zr_quant_params p = {8, 32, ZR_QUANT_SYM};
    float am = u2f(0x3f800001u), v = -u2f(0x3c400001u); /* 0x1.000002p+0, -0x1.800002p-7 */
    float s = am / 128.0f, inv = 1.0f / s;
    /* v / s is exactly -1.5 (code -2); v * inv rounds to just above (code -1) */
    TEST_CHECK(v / s == -1.5f && v * inv > -1.5f);
    float x[32], r[32], y[32];
    uint8_t b[256];
    for (int k = 0; k < nim; k++) {
        TEST_OK(zr_quant_set_impl(im[k]));
        for (int i = 0; i < 32; i++) {
            x[i] = i == 0 ? am : v;
            r[i] = 0.0f;
        }
        TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, 32, 1.0f, r, b, NULL));
        const uint8_t *q = b + 32 + 4; /* header, one scale */
        int ok = q[0] == 127;
        for (int i = 1; i < 32; i++) {
            ok &= q[i] == 0xff && r[i] == v + s; /* q = -1, r = v - (-1 * s) */
        }
        TEST_CHECK(ok);
        /* subnormal-sized values: div = 2^-147 has no finite reciprocal (pre 2^64) */
        for (int i = 0; i < 32; i++) {
            x[i] = i == 0 ? ldexpf(1.0f, -140) : (float)(i % 7 - 3) * ldexpf(1.0f, -145);
        }
        TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, 32, 1.0f, NULL, b, NULL));
        TEST_OK(zr_quant_decode(b, ZR_DTYPE_F32, y, 32));
        ok = q[0] == 127;
        for (int i = 1; i < 32; i++) {
            ok &= (int8_t)q[i] == 4 * (i % 7 - 3) && y[i] == x[i];
        }
        TEST_CHECK(ok);
    }
    TEST_OK(zr_quant_set_impl(ZR_QUANT_IMPL_AUTO));
}

/* Error feedback: over many steps the decoded sum tracks the true sum. */
static void test_error_feedback(void)
{
    zr_quant_params p = {4, 32, ZR_QUANT_SYM};
    size_t n = 96;
    float x[96], r[96], y[96];
    double sum_true[96] = {0}, sum_dq[96] = {0}, sum_plain[96] = {0};
    zr_test_rng rng = {5};
    for (size_t i = 0; i < n; i++) {
        x[i] = zr_test_rng_uniform(&rng);
        r[i] = 0.0f;
    }
    x[0] = 1.0f; /* absmax pinned, so the step is 1/8 */
    uint8_t b[512], c[512];
    int steps = 200;
    for (int s = 0; s < steps; s++) {
        TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, n, 0.5f, r, b, NULL));
        TEST_OK(zr_quant_decode(b, ZR_DTYPE_F32, y, n));
        TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, n, 0.5f, NULL, c, NULL));
        for (size_t i = 0; i < n; i++) {
            sum_true[i] += 0.5 * x[i];
            sum_dq[i] += y[i];
        }
        TEST_OK(zr_quant_decode(c, ZR_DTYPE_F32, y, n));
        for (size_t i = 0; i < n; i++) {
            sum_plain[i] += y[i];
        }
    }
    double worst_fb = 0, worst_plain = 0;
    for (size_t i = 0; i < n; i++) {
        worst_fb = fmax(worst_fb, fabs(sum_dq[i] - sum_true[i]));
        worst_plain = fmax(worst_plain, fabs(sum_plain[i] - sum_true[i]));
    }
    /* with feedback the drift stays within about one step (0.0625 * 2); without it grows */
    TEST_CHECKF(worst_fb < 0.2, "feedback drift %g", worst_fb);
    TEST_CHECKF(worst_plain > 1.0, "plain drift %g (expected a visible bias)", worst_plain);
}

static void test_nonfinite(void)
{
    int G = 32;
    size_t n = (size_t)G * 6 + 5;
    float *x = malloc(n * 4), *r = malloc(n * 4), *y = malloc(n * 4);
    zr_test_rng rng = {31};
    for (int scheme = 0; scheme < 2; scheme++) {
        for (int bits = 4; bits <= 8; bits += 4) {
            for (int t = 0; t < 2; t++) {
                fill(D_GAUSS, &rng, x, n, (size_t)G);
                x[3] = INFINITY;          /* group 0 */
                x[G + 5] = NAN;           /* group 1 */
                x[3 * G + 1] = -INFINITY; /* group 3 */
                x[3 * G + 2] = NAN;
                x[6 * G + 4] = NAN; /* the partial last group */
                for (size_t i = 0; i < n; i++) {
                    r[i] = 0.01f;
                }
                zr_quant_params p = {bits, G, (zr_quant_scheme)scheme};
                size_t nf = 0;
                check_all(&p, (zr_dtype)t, x, n, 1.0f, NULL, &nf);
                TEST_EQ_INT(nf, 4);
                check_all(&p, (zr_dtype)t, x, n, 2.0f, r, &nf);
                TEST_EQ_INT(nf, 4);
                size_t bytes = zr_quant_block_bytes(&p, n);
                if (t == 0) {
                    uint8_t *b = malloc(bytes);
                    TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, n, 1.0f, r, b, &nf));
                    zr_quant_header h;
                    memcpy(&h, b, sizeof h);
                    TEST_EQ_INT(h.nonfinite_groups, 4);
                    TEST_OK(zr_quant_decode(b, ZR_DTYPE_F32, y, n));
                    int ok = 1;
                    for (size_t i = 0; i < n; i++) {
                        size_t g = i / (size_t)G;
                        int bad_group = g == 0 || g == 1 || g == 3 || g == 6;
                        ok &= bad_group ? isnan(y[i]) && r[i] == 0.0f : isfinite(y[i]);
                    }
                    TEST_CHECKF(ok, "non-finite groups decode to NaN, others finite");
                    /* the payload of a non-finite group is zero */
                    const uint8_t *pay = b + h.payload_offset;
                    int zero = 1;
                    for (size_t i = 0; i < (size_t)G * bits / 8; i++) {
                        zero &= pay[i] == 0;
                    }
                    TEST_CHECK(zero);
                    free(b);
                }
            }
        }
    }
    /* finite input that overflows after mul is non-finite too */
    zr_quant_params p = {8, 32, ZR_QUANT_SYM};
    for (int i = 0; i < 32; i++) {
        x[i] = 1e30f;
    }
    size_t nf = 0;
    check_all(&p, ZR_DTYPE_F32, x, 32, 1e10f, NULL, &nf);
    TEST_EQ_INT(nf, 1);
    free(x);
    free(r);
    free(y);
}

/* sum_requant equals decode, fp32 sum in order, mul, encode; for every impl. */
static void test_sum_requant(void)
{
    zr_test_rng rng = {4242};
    static const zr_quant_params in_p[] = {{4, 64, ZR_QUANT_SYM},
                                           {8, 32, ZR_QUANT_SYM},
                                           {4, 256, ZR_QUANT_ASYM},
                                           {8, 64, ZR_QUANT_SYM},
                                           {4, 32, ZR_QUANT_SYM}};
    zr_quant_impl im[3];
    int ni = impls(im);
    for (int k = 1; k <= 5; k++) {
        for (int op = 0; op < 4; op++) {
            zr_quant_params p = {op % 2 ? 8 : 4, op < 2 ? 64 : 32,
                                 op == 3 ? ZR_QUANT_ASYM : ZR_QUANT_SYM};
            size_t n = 64 * 17 + 3;
            float *x = malloc(n * 4), *sum = malloc(n * 4), *r0 = malloc(n * 4);
            float *r_ref = malloc(n * 4), *r = malloc(n * 4);
            void *blocks[5];
            for (int j = 0; j < k; j++) {
                fill(j == 2 ? D_OUTLIER : D_GAUSS, &rng, x, n, 64);
                blocks[j] = malloc(zr_quant_block_bytes(&in_p[j], n));
                TEST_OK(zr_quant_encode(&in_p[j], ZR_DTYPE_F32, x, n, 1.0f, NULL, blocks[j], NULL));
            }
            for (size_t i = 0; i < n; i++) {
                r0[i] = zr_test_rng_uniform(&rng) * 0.01f;
            }
            size_t bytes = zr_quant_block_bytes(&p, n);
            uint8_t *want = malloc(bytes), *got = malloc(bytes);
            /* the manual path, with the oracle */
            zr_quant_set_impl(ZR_QUANT_IMPL_SCALAR);
            TEST_OK(zr_quant_decode(blocks[0], ZR_DTYPE_F32, sum, n));
            for (int j = 1; j < k; j++) {
                TEST_OK(zr_quant_decode_add(blocks[j], sum, n));
            }
            memcpy(r_ref, r0, n * 4);
            size_t nf_want = 0, nf = 0;
            float mul = 1.0f / (float)k;
            uint8_t *want_nores = malloc(bytes);
            TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, sum, n, mul, r_ref, want, &nf_want));
            TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, sum, n, mul, NULL, want_nores, NULL));
            for (int m = 0; m < ni; m++) {
                zr_quant_set_impl(im[m]);
                memcpy(r, r0, n * 4);
                memset(got, 0x5a, bytes);
                TEST_OK(
                    zr_quant_sum_requant((const void *const *)blocks, k, n, mul, &p, r, got, &nf));
                TEST_CHECKF(memcmp(want, got, bytes) == 0, "k %d op %d %s: block differs", k, op,
                            zr_quant_impl_name(im[m]));
                TEST_CHECKF(memcmp(r_ref, r, n * 4) == 0, "k %d op %d %s: residual differs", k, op,
                            zr_quant_impl_name(im[m]));
                TEST_EQ_INT(nf, nf_want);
                TEST_OK(zr_quant_sum_requant((const void *const *)blocks, k, n, mul, &p, NULL, got,
                                             NULL));
                TEST_CHECKF(memcmp(want_nores, got, bytes) == 0,
                            "k %d op %d %s: block differs (no residual)", k, op,
                            zr_quant_impl_name(im[m]));
            }
            free(want_nores);
            zr_quant_set_impl(ZR_QUANT_IMPL_AUTO);
            /* a block of the wrong length is refused */
            TEST_FAILS(zr_quant_sum_requant((const void *const *)blocks, k, n - 1, mul, &p, NULL,
                                            got, NULL),
                       ZR_ERR_INVALID, "elements");
            for (int j = 0; j < k; j++) {
                free(blocks[j]);
            }
            free(x);
            free(sum);
            free(r0);
            free(r_ref);
            free(r);
            free(want);
            free(got);
        }
    }
}

static void test_validate(void)
{
    zr_quant_params p = {4, 64, ZR_QUANT_SYM};
    size_t n = 200;
    float x[200];
    zr_test_rng rng = {8};
    fill(D_GAUSS, &rng, x, n, 64);
    size_t bytes = zr_quant_block_bytes(&p, n);
    uint8_t *good = malloc(bytes + 8), *b = malloc(bytes + 8);
    TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, n, 1.0f, NULL, good, NULL));
    TEST_OK(zr_quant_validate(good, bytes, &p, n));
    TEST_OK(zr_quant_validate(good, bytes, NULL, SIZE_MAX));
    TEST_EQ_INT(zr_quant_block_count(good), n);
    zr_quant_header h0;
    memcpy(&h0, good, sizeof h0);
    TEST_EQ_INT(h0.magic, ZR_QUANT_MAGIC);
    TEST_CHECK(memcmp(good, "ZRQ1", 4) == 0);

#define MUTATE(field, value, substr)                                                               \
    do {                                                                                           \
        memcpy(b, good, bytes);                                                                    \
        zr_quant_header h = h0;                                                                    \
        h.field = value;                                                                           \
        memcpy(b, &h, sizeof h);                                                                   \
        TEST_FAILS(zr_quant_validate(b, bytes, NULL, SIZE_MAX), ZR_ERR_FORMAT, substr);            \
    } while (0)

    MUTATE(magic, 0x12345678u, "magic");
    MUTATE(bits, 5, "bits");
    MUTATE(bits, 8, "size"); /* a valid value that does not match the size */
    MUTATE(scheme, 2, "scheme");
    MUTATE(group, 36, "group");
    MUTATE(group, 16, "group");
    MUTATE(group, 65536 * 2, "group");
    MUTATE(reserved, 1, "reserved");
    MUTATE(count, 201, "size");
    MUTATE(count, (uint64_t)1 << 62, "count");
    MUTATE(payload_offset, 36, "payload_offset");
    MUTATE(nonfinite_groups, 5, "nonfinite_groups");
#undef MUTATE
    TEST_FAILS(zr_quant_validate(good, bytes - 4, NULL, SIZE_MAX), ZR_ERR_FORMAT, "size");
    TEST_FAILS(zr_quant_validate(good, bytes + 4, NULL, SIZE_MAX), ZR_ERR_FORMAT, "size");
    TEST_FAILS(zr_quant_validate(good, 31, NULL, SIZE_MAX), ZR_ERR_FORMAT, "header");
    TEST_FAILS(zr_quant_validate(good, bytes, &p, 199), ZR_ERR_FORMAT, "count");
    zr_quant_params e = p;
    e.bits = 8;
    TEST_FAILS(zr_quant_validate(good, bytes, &e, n), ZR_ERR_FORMAT, "bits");
    e = p;
    e.scheme = ZR_QUANT_ASYM;
    TEST_FAILS(zr_quant_validate(good, bytes, &e, n), ZR_ERR_FORMAT, "scheme");
    e = p;
    e.group = 128;
    TEST_FAILS(zr_quant_validate(good, bytes, &e, n), ZR_ERR_FORMAT, "group");
    /* decode refuses a count mismatch and a foreign block */
    float y[200];
    TEST_FAILS(zr_quant_decode(good, ZR_DTYPE_F32, y, 199), ZR_ERR_INVALID, "elements");
    memcpy(b, good, bytes);
    b[0] ^= 1;
    TEST_FAILS(zr_quant_decode(b, ZR_DTYPE_F32, y, n), ZR_ERR_FORMAT, "header");
    TEST_FAILS(zr_quant_encode(&e, (zr_dtype)9, x, n, 1.0f, NULL, b, NULL), ZR_ERR_INVALID,
               "dtype");
    /* a block at a 4-byte (not 8-byte) offset works: messages pack blocks back to back */
    memcpy(b + 4, good, bytes);
    TEST_OK(zr_quant_validate(b + 4, bytes, &p, n));
    TEST_OK(zr_quant_decode(b + 4, ZR_DTYPE_F32, y, n));
    free(good);
    free(b);
}

/* Asymmetric beats symmetric on one-sided data; int8 beats int4 (sanity of the variants). */
static void test_asym_vs_sym(void)
{
    size_t n = 4096;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    zr_test_rng rng = {3};
    for (size_t i = 0; i < n; i++) {
        x[i] = 1.0f + fabsf(zr_test_rng_uniform(&rng));
    }
    double err[2][2];
    for (int bits = 4; bits <= 8; bits += 4) {
        for (int scheme = 0; scheme < 2; scheme++) {
            zr_quant_params p = {bits, 256, (zr_quant_scheme)scheme};
            uint8_t *b = malloc(zr_quant_block_bytes(&p, n));
            TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, n, 1.0f, NULL, b, NULL));
            TEST_OK(zr_quant_decode(b, ZR_DTYPE_F32, y, n));
            double se = 0;
            for (size_t i = 0; i < n; i++) {
                se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            }
            err[bits == 8][scheme] = sqrt(se / (double)n);
            free(b);
        }
    }
    TEST_CHECK(err[0][1] < err[0][0] && err[1][1] < err[1][0]);
    TEST_CHECK(err[1][0] < err[0][0]);
    free(x);
    free(y);
}

/* What every codec call gives on one input, for comparing thread counts. */
typedef struct codec_out {
    uint8_t *block, *block_bf16, *sum_block;
    float *residual, *dec, *acc, *sum_residual, *widened;
    zr_bf16 *dec_bf16, *narrowed;
    size_t nf, nf_sum;
} codec_out;

static void codec_run(const zr_quant_params *p, const float *x, const zr_bf16 *xh, size_t n,
                      const float *r0, codec_out *o)
{
    size_t bytes = zr_quant_block_bytes(p, n);
    memcpy(o->residual, r0, n * 4);
    memset(o->block, 0x5a, bytes);
    TEST_OK(zr_quant_encode(p, ZR_DTYPE_F32, x, n, 0.5f, o->residual, o->block, &o->nf));
    TEST_OK(zr_quant_encode(p, ZR_DTYPE_BF16, xh, n, 1.0f, NULL, o->block_bf16, NULL));
    TEST_OK(zr_quant_decode(o->block, ZR_DTYPE_F32, o->dec, n));
    TEST_OK(zr_quant_decode(o->block, ZR_DTYPE_BF16, o->dec_bf16, n));
    memcpy(o->acc, r0, n * 4);
    TEST_OK(zr_quant_decode_add(o->block_bf16, o->acc, n));
    const void *three[3] = {o->block, o->block_bf16, o->block};
    memcpy(o->sum_residual, r0, n * 4);
    TEST_OK(
        zr_quant_sum_requant(three, 3, n, 1.0f / 3, p, o->sum_residual, o->sum_block, &o->nf_sum));
    zr_bf16_from_f32_n(o->narrowed, x, n);
    zr_bf16_to_f32_n(o->widened, o->narrowed, n);
}

/*
 * The codecs split a block's groups, and the bf16 casts their elements, over
 * the process's threads (zr_threads_set): every output at 2 and 3 threads is
 * the 1-thread output bit for bit, for blocks of several pool tasks with a
 * short last group, small groups and large, both widths and schemes, error
 * feedback, and non-finite groups counted once each.
 */
static void test_threads(void)
{
    zr_test_rng rng = {777};
    size_t n = 5 * 65536 + 1027; /* several tasks at every group size below, a short tail */
    float *x = malloc(n * 4), *r0 = malloc(n * 4);
    zr_bf16 *xh = malloc(n * 2);
    fill(D_GAUSS, &rng, x, n, 1024);
    for (size_t i = 0; i < n; i++) {
        r0[i] = zr_test_rng_uniform(&rng) * 0.01f;
    }
    x[3 * 1024 + 5] = NAN; /* non-finite groups in the first and the last task */
    x[n - 2] = INFINITY;
    zr_bf16_from_f32_n(xh, x, n);
    static const zr_quant_params ps[] = {{8, 1024, ZR_QUANT_SYM},
                                         {4, 1024, ZR_QUANT_SYM},
                                         {4, 32, ZR_QUANT_ASYM},
                                         {8, 4096, ZR_QUANT_ASYM}};
    for (size_t c = 0; c < sizeof ps / sizeof ps[0]; c++) {
        size_t bytes = zr_quant_block_bytes(&ps[c], n);
        codec_out o[3];
        for (int t = 0; t < 3; t++) {
            o[t] = (codec_out){malloc(bytes),
                               malloc(bytes),
                               malloc(bytes),
                               malloc(n * 4),
                               malloc(n * 4),
                               malloc(n * 4),
                               malloc(n * 4),
                               malloc(n * 4),
                               malloc(n * 2),
                               malloc(n * 2),
                               0,
                               0};
            TEST_OK(zr_threads_set(t + 1));
            TEST_EQ_INT(zr_threads_get(), t + 1);
            codec_run(&ps[c], x, xh, n, r0, &o[t]);
        }
        TEST_OK(zr_threads_set(1));
        TEST_CHECKF(o[0].nf >= 2 && o[0].nf_sum >= 2, "%zu, %zu non-finite groups", o[0].nf,
                    o[0].nf_sum);
        for (int t = 1; t < 3; t++) {
            const char *what = NULL;
            what = memcmp(o[t].block, o[0].block, bytes) ? "block" : what;
            what = memcmp(o[t].block_bf16, o[0].block_bf16, bytes) ? "block of bf16" : what;
            what = memcmp(o[t].sum_block, o[0].sum_block, bytes) ? "sum_requant block" : what;
            what = memcmp(o[t].residual, o[0].residual, n * 4) ? "residual" : what;
            what = memcmp(o[t].sum_residual, o[0].sum_residual, n * 4) ? "sum residual" : what;
            what = memcmp(o[t].dec, o[0].dec, n * 4) ? "decode" : what;
            what = memcmp(o[t].dec_bf16, o[0].dec_bf16, n * 2) ? "decode to bf16" : what;
            what = memcmp(o[t].acc, o[0].acc, n * 4) ? "decode_add" : what;
            what = memcmp(o[t].narrowed, o[0].narrowed, n * 2) ? "bf16 cast" : what;
            what = memcmp(o[t].widened, o[0].widened, n * 4) ? "fp32 cast" : what;
            what = o[t].nf != o[0].nf || o[t].nf_sum != o[0].nf_sum ? "non-finite count" : what;
            TEST_CHECKF(what == NULL, "%d-bit group %d: %s differs at %d threads", ps[c].bits,
                        ps[c].group, what, t + 1);
        }
        for (int t = 0; t < 3; t++) {
            void *f[] = {o[t].block,    o[t].block_bf16, o[t].sum_block,    o[t].residual,
                         o[t].dec,      o[t].acc,        o[t].sum_residual, o[t].widened,
                         o[t].dec_bf16, o[t].narrowed};
            for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
                free(f[i]);
            }
        }
    }
    free(x);
    free(r0);
    free(xh);
}

int main(void)
{
    TEST_RUN(test_params_and_sizes);
    TEST_RUN(test_impl_select);
    TEST_RUN(test_bf16);
    TEST_RUN(test_exact_roundtrip);
    TEST_RUN(test_zero_and_constant);
    TEST_RUN(test_reciprocal_rule);
    TEST_RUN(test_rcp_refine);
    TEST_RUN(test_properties);
    TEST_RUN(test_lengths);
    TEST_RUN(test_error_feedback);
    TEST_RUN(test_nonfinite);
    TEST_RUN(test_sum_requant);
    TEST_RUN(test_validate);
    TEST_RUN(test_asym_vs_sym);
    TEST_RUN(test_threads);
    return zr_test_finish();
}
