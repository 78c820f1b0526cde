/*
 * test_gpu_quant.c - the codec kernels on a CUDA device (zr/quant_cuda.h)
 * against the CPU oracle, byte for byte.
 *
 * Runs on whatever CUDA device answers: the GPU emulator's (suite emu,
 * build/emu) or a real GPU (suite gpu). Without one it prints one line
 * saying why and counts as skipped.
 *
 *   encode      every bits x scheme x input type, with and without mul and
 *               error feedback, every length 0..3G+7 for G = 32 and 40
 *               (partial groups, every 4-bit and chunk tail) and the lengths
 *               around the edges for G = 1024 (warp teams, 4 chunks a lane),
 *               2048 (8 chunks) and 4096 (a block per group); adversarial
 *               data (NaN, +-Inf, denormals, +-0, huge values, all-equal
 *               groups, ties); aligned and unaligned pointers. The GPU's
 *               block and residual equal the CPU scalar oracle's bytes.
 *   decode      the CPU's block decoded on the GPU (fp32, bf16, add) equals
 *               the CPU's decode, and the GPU's block decoded on the CPU too:
 *               the wire format is one.
 *   sum_requant inputs of mixed formats, with residual and mul = 1/k; a bad
 *               input header gives an output the CPU refuses.
 *   arguments   a CPU stream, misalignment, bad types, bits, k and stride,
 *               AdamW's step 0 refused.
 * The codec writes its NaNs by rule, so blocks and decodes are compared with
 * memcmp. The bf16 casts, the elementwise add, the rank-ordered sums, AdamW
 * and the sum of squares are rows of test_backend_ops' table.
 */
#include "test.h"
#include "zr/optim.h"
#include "zr/quant_cuda.h"

#include <float.h>

static zr_device gpu;
static zr_stream *st;

/* device scratch, reused by every case; sized for the largest */
#define DEV_BYTES ((size_t)20 << 20)
static uint8_t *d_a, *d_b, *d_c, *d_d;

static float u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static void put(void *dev, const void *host, size_t bytes)
{
    TEST_OK(zr_memcpy_async(dev, host, bytes, st));
    TEST_OK(zr_stream_sync(st));
}

static void get(void *host, const void *dev, size_t bytes)
{
    TEST_OK(zr_memcpy_async(host, dev, bytes, st));
    TEST_OK(zr_stream_sync(st));
}

/* First differing byte, or -1. */
static long diff_at(const void *a, const void *b, size_t n)
{
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++) {
        if (x[i] != y[i]) {
            return (long)i;
        }
    }
    return -1;
}

/* ---- adversarial data ------------------------------------------------------------ */

enum { K_GAUSS, K_SPECIAL, K_DENORMAL, K_EQUAL, K_HUGE, K_TIES, K_ZERO, K_RECIP, K_COUNT };

static void fill(int kind, zr_test_rng *rng, float *x, size_t n, size_t group)
{
    static const uint32_t specials[] = {0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u,
                                        0x00000001u, 0x80000001u, 0x007fffffu, 0x00000000u,
                                        0x80000000u, 0x7f7fffffu, 0xff7fffffu, 0x7f800001u};
    for (size_t i = 0; i < n; i++) {
        size_t gi = i / group;
        float u = zr_test_rng_uniform(rng);
        switch (kind) {
        case K_GAUSS:
            x[i] = zr_test_rng_normal(rng);
            break;
        case K_SPECIAL: /* every third group holds one special value */
            x[i] = u;
            if (gi % 3 == 1 && i % group == (gi * 5) % group) {
                x[i] = u2f(specials[gi % (sizeof specials / sizeof specials[0])]);
            }
            break;
        case K_DENORMAL: /* tiny groups: the scale is subnormal or underflows */
            x[i] = u * (gi % 2 ? 3e-44f : 1e-39f);
            break;
        case K_EQUAL: /* all-equal groups, of either sign */
            x[i] = (gi % 2 ? -1.0f : 1.0f) * (float)(gi + 1) * 0.37f;
            break;
        case K_HUGE: /* near FLT_MAX: the asym range needs double */
            x[i] = u * 3.0e38f;
            break;
        case K_TIES:
            x[i] = i % group == 0 ? -8.0f : (float)((int)(u * 7.0f)) + 0.5f;
            break;
        case K_ZERO:
            x[i] = (i & 1) ? -0.0f : 0.0f;
            break;
        case K_RECIP: /* v / scale is -1.5 exactly, v * (1 / scale) just above (quant_rules.h) */
            x[i] = i % group == 0 ? u2f(0x3f800001u) : (u < 0.5f ? -u2f(0x3c400001u) : u);
            break;
        }
    }
}

/* ---- encode and decode ---------------------------------------------------------------- */

typedef struct enc_case {
    zr_quant_params p;
    zr_dtype t;
    size_t n;
    float mul;
    int residual;
    size_t off;  /* elements the device input is shifted by (1: no 16-byte loads) */
    size_t boff; /* bytes the device block is shifted by (4: no 8-byte stores) */
} enc_case;

/*
 * One case: the CPU scalar oracle's block and residual, the GPU's block and
 * residual (equal bytes), then both decoders on both blocks.
 */
static void check_case(const enc_case *c, const float *xf, const float *r0)
{
    size_t n = c->n, nn = n ? n : 1, bytes = zr_quant_block_bytes(&c->p, n);
    size_t es = zr_dtype_size(c->t);
    uint8_t *x = malloc(nn * 4), *ref = malloc(bytes), *blk = malloc(bytes);
    float *r_ref = malloc(nn * 4), *r_gpu = malloc(nn * 4), *d_ref = malloc(nn * 4);
    float *d_gpu = malloc(nn * 4), *acc = malloc(nn * 4), *acc_ref = malloc(nn * 4);
    if (c->t == ZR_DTYPE_BF16) {
        zr_bf16_from_f32_n((zr_bf16 *)x, xf, n);
    } else {
        memcpy(x, xf, n * 4);
    }
    memcpy(r_ref, r0, n * 4);
    TEST_OK(zr_quant_set_impl(ZR_QUANT_IMPL_SCALAR));
    TEST_OK(zr_quant_encode(&c->p, c->t, x, n, c->mul, c->residual ? r_ref : NULL, ref, NULL));

    uint8_t *dx = d_a + c->off * es, *dblk = d_b + c->boff;
    float *dr = (float *)d_c + c->off;
    put(dx, x, n * es);
    put(dr, r0, n * 4);
    TEST_OK(zr_memset_async(dblk, 0xa5, bytes, st)); /* every byte must be written */
    TEST_OK(zr_quant_cuda_encode(&c->p, c->t, dx, n, c->mul, c->residual ? dr : NULL, dblk, st));
    get(blk, dblk, bytes);
    get(r_gpu, dr, n * 4);
    const char *sch = c->p.scheme == ZR_QUANT_ASYM ? "asym" : "sym";
    long at = diff_at(ref, blk, bytes);
    TEST_CHECKF(at < 0, "encode int%d %s G %d n %zu %s mul %g%s off %zu: byte %ld of %zu",
                c->p.bits, sch, c->p.group, n, zr_dtype_name(c->t), c->mul,
                c->residual ? " residual" : "", c->off, at, bytes);
    if (c->residual) {
        at = diff_at(r_ref, r_gpu, n * 4);
        TEST_CHECKF(at < 0, "residual int%d %s G %d n %zu: element %ld", c->p.bits, sch, c->p.group,
                    n, at / 4);
    }
    /* the CPU decodes the GPU's block as its own, and the GPU the CPU's */
    TEST_OK(zr_quant_decode(ref, ZR_DTYPE_F32, d_ref, n));
    TEST_OK(zr_quant_decode(blk, ZR_DTYPE_F32, d_gpu, n));
    TEST_CHECKF(diff_at(d_ref, d_gpu, n * 4) < 0, "CPU decode of the GPU block differs");
    for (int mode = 0; mode < 3; mode++) {
        size_t os = mode == 1 ? 2 : 4;
        float *dout = (float *)d_d + c->off;
        put(d_b, ref, bytes);
        for (size_t i = 0; i < n; i++) {
            acc[i] = (float)(i % 17) - 8.25f;
        }
        memcpy(acc_ref, acc, n * 4);
        if (mode == 2) {
            put(dout, acc, n * 4);
            TEST_OK(zr_quant_decode_add(ref, acc_ref, n));
            TEST_OK(zr_quant_cuda_decode_add(d_b, dout, n, st));
        } else {
            zr_dtype ot = mode == 1 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
            TEST_OK(zr_quant_decode(ref, ot, acc_ref, n));
            TEST_OK(zr_quant_cuda_decode(d_b, ot, dout, n, st));
        }
        get(acc, dout, n * os);
        at = diff_at(acc_ref, acc, n * os);
        TEST_CHECKF(at < 0, "decode mode %d int%d %s G %d n %zu off %zu: byte %ld", mode, c->p.bits,
                    sch, c->p.group, n, c->off, at);
    }
    TEST_OK(zr_quant_set_impl(ZR_QUANT_IMPL_AUTO));
    free(x);
    free(ref);
    free(blk);
    free(r_ref);
    free(r_gpu);
    free(d_ref);
    free(d_gpu);
    free(acc);
    free(acc_ref);
}

/* Lengths of one group size: all of 0..3G+7 for small groups, the edges otherwise. */
static size_t lengths_of(int G, size_t *out)
{
    size_t m = 0, g = (size_t)G;
    if (G <= 40) {
        for (size_t n = 0; n <= 3 * g + 7; n++) {
            out[m++] = n;
        }
        return m;
    }
    size_t edges[] = {0, 1, 7, 8, 9, g - 1, g, g + 1, 2 * g + 3, 3 * g + 7};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        out[m++] = edges[i];
    }
    return m;
}

static void sweep(const int *groups, int ngroups)
{
    zr_test_rng rng = {4242};
    size_t maxn = 3 * 4096 + 7;
    float *x = malloc(maxn * 4), *r = malloc(maxn * 4);
    size_t *ns = malloc((3 * 40 + 8) * sizeof *ns);
    int cases = 0;
    for (int gi = 0; gi < ngroups; gi++) {
        int G = groups[gi];
        size_t nl = lengths_of(G, ns);
        for (size_t li = 0; li < nl; li++) {
            /* the data kind, flags and pointer offsets turn with the length, so
             * every combination meets many lengths without a product of loops */
            int kind = (int)((li + (size_t)gi) % K_COUNT);
            fill(kind, &rng, x, ns[li], (size_t)G);
            for (size_t i = 0; i < ns[li]; i++) {
                r[i] = zr_test_rng_uniform(&rng) * 0.01f;
            }
            for (int v = 0; v < 8; v++) {
                enc_case c = {{v & 1 ? 4 : 8, G, v & 2 ? ZR_QUANT_ASYM : ZR_QUANT_SYM},
                              v & 4 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32,
                              ns[li],
                              (li + (size_t)v) % 3 == 0 ? 0.25f : 1.0f,
                              (int)((li + (size_t)v) % 2),
                              (li + (size_t)v) % 5 == 0 ? 1 : 0,
                              (li + (size_t)v) % 7 == 0 ? 4 : 0};
                int before = zr_test_failed_checks;
                check_case(&c, x, r);
                if (zr_test_failed_checks != before) {
                    printf("  (data kind %d)\n", kind);
                }
                cases++;
            }
        }
    }
    printf("  %d cases\n", cases);
    free(x);
    free(r);
    free(ns);
}

static void test_encode_small_groups(void)
{
    static const int groups[] = {32, 40};
    sweep(groups, 2);
}

static void test_encode_large_groups(void)
{
    static const int groups[] = {1024, 2048, 4096};
    sweep(groups, 3);
}

/* ---- decode-sum-requantize -------------------------------------------------------------- */

static void sum_case(int k, size_t n, const zr_quant_params *out_p, int residual, zr_test_rng *rng)
{
    size_t nn = n ? n : 1;
    float *x = malloc(nn * 4), *r0 = malloc(nn * 4), *r_ref = malloc(nn * 4);
    float *r_gpu = malloc(nn * 4);
    void *blocks[8];
    const void *dblocks[8];
    size_t off = 0;
    for (int j = 0; j < k; j++) {
        /* each input its own format */
        zr_quant_params p = {j % 2 ? 4 : 8, j % 3 ? 32 : 64, j % 2 ? ZR_QUANT_ASYM : ZR_QUANT_SYM};
        fill(j == 2 ? K_SPECIAL : K_GAUSS, rng, x, n, 32);
        size_t b = zr_quant_block_bytes(&p, n);
        blocks[j] = malloc(b);
        TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, n, 1.0f, NULL, blocks[j], NULL));
        put(d_a + off, blocks[j], b);
        dblocks[j] = d_a + off;
        off += b;
    }
    for (size_t i = 0; i < n; i++) {
        r0[i] = zr_test_rng_uniform(rng) * 0.01f;
    }
    memcpy(r_ref, r0, n * 4);
    size_t bytes = zr_quant_block_bytes(out_p, n);
    uint8_t *ref = malloc(bytes), *blk = malloc(bytes);
    float mul = 1.0f / (float)k;
    TEST_OK(zr_quant_set_impl(ZR_QUANT_IMPL_SCALAR));
    TEST_OK(zr_quant_sum_requant((const void *const *)blocks, k, n, mul, out_p,
                                 residual ? r_ref : NULL, ref, NULL));
    TEST_OK(zr_quant_set_impl(ZR_QUANT_IMPL_AUTO));
    put(d_c, r0, n * 4);
    TEST_OK(zr_memset_async(d_b, 0x5a, bytes, st));
    TEST_OK(zr_quant_cuda_sum_requant(dblocks, k, n, mul, out_p, residual ? (float *)d_c : NULL,
                                      d_b, st));
    get(blk, d_b, bytes);
    get(r_gpu, d_c, n * 4);
    long at = diff_at(ref, blk, bytes);
    TEST_CHECKF(at < 0, "sum_requant k %d n %zu -> int%d %s G %d: byte %ld of %zu", k, n,
                out_p->bits, out_p->scheme ? "asym" : "sym", out_p->group, at, bytes);
    if (residual) {
        TEST_CHECKF(diff_at(r_ref, r_gpu, n * 4) < 0, "sum_requant residual k %d n %zu", k, n);
    }
    for (int j = 0; j < k; j++) {
        free(blocks[j]);
    }
    free(x);
    free(r0);
    free(r_ref);
    free(r_gpu);
    free(ref);
    free(blk);
}

static void test_sum_requant(void)
{
    zr_test_rng rng = {7};
    static const size_t ns[] = {0, 1, 31, 32, 33, 64, 100, 103, 200};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        for (int k = 1; k <= 5; k += 2) {
            zr_quant_params p = {(int)(i % 2 ? 8 : 4), 32, i % 3 ? ZR_QUANT_SYM : ZR_QUANT_ASYM};
            sum_case(k, ns[i], &p, (int)(i % 2), &rng);
        }
    }
    zr_quant_params big = {4, 1024, ZR_QUANT_SYM};
    sum_case(2, 3 * 1024 + 7, &big, 1, &rng);
    zr_quant_params huge = {8, 4096, ZR_QUANT_ASYM};
    sum_case(3, 4096 + 9, &huge, 0, &rng);

    /* an input that is not a block of count elements: the output is refused */
    zr_quant_params p = {8, 32, ZR_QUANT_SYM};
    float x[40] = {1.0f};
    uint8_t in[256], out[256];
    TEST_OK(zr_quant_encode(&p, ZR_DTYPE_F32, x, 40, 1.0f, NULL, in, NULL));
    put(d_a, in, zr_quant_block_bytes(&p, 40));
    const void *one[1] = {d_a};
    TEST_OK(zr_quant_cuda_sum_requant(one, 1, 39, 1.0f, &p, NULL, d_b, st));
    get(out, d_b, zr_quant_block_bytes(&p, 39));
    TEST_FAILS(zr_quant_validate(out, zr_quant_block_bytes(&p, 39), &p, 39), ZR_ERR_FORMAT,
               "magic");
    /* and a decode of a header that does not match yields NaN, not numbers */
    float y[39];
    TEST_OK(zr_quant_cuda_decode(d_a, ZR_DTYPE_F32, d_d, 39, st));
    get(y, d_d, sizeof y);
    int all_nan = 1;
    for (int i = 0; i < 39; i++) {
        all_nan &= isnan(y[i]);
    }
    TEST_CHECK(all_nan);
}

/* ---- arguments --------------------------------------------------------------------------------
 */

static void test_arguments(void)
{
    zr_quant_params p = {8, 32, ZR_QUANT_SYM};
    zr_device cpu = zr_device_cpu();
    zr_stream *cs = NULL;
    TEST_OK(zr_stream_create(&cpu, &cs));
    TEST_FAILS(zr_quant_cuda_encode(&p, ZR_DTYPE_F32, d_a, 8, 1.0f, NULL, d_b, cs), ZR_ERR_INVALID,
               "CUDA device");
    zr_stream_destroy(cs);
    TEST_FAILS(zr_quant_cuda_encode(&p, ZR_DTYPE_F32, d_a, 8, 1.0f, NULL, d_b + 2, st),
               ZR_ERR_INVALID, "4-byte aligned");
    TEST_FAILS(zr_quant_cuda_encode(&p, (zr_dtype)9, d_a, 8, 1.0f, NULL, d_b, st), ZR_ERR_INVALID,
               "dtype");
    zr_quant_params bad = {6, 32, ZR_QUANT_SYM};
    TEST_FAILS(zr_quant_cuda_encode(&bad, ZR_DTYPE_F32, d_a, 8, 1.0f, NULL, d_b, st),
               ZR_ERR_INVALID, "bits");
    const void *none[1] = {d_a};
    TEST_FAILS(zr_quant_cuda_sum_requant(none, 0, 8, 1.0f, &p, NULL, d_b, st), ZR_ERR_INVALID,
               "k = 0");
    TEST_FAILS(zr_quant_cuda_sum_ranks((float *)d_b, d_a, ZR_DTYPE_F32, 2, 4, 8, 1.0f, st),
               ZR_ERR_INVALID, "stride");
    zr_adamw h = zr_adamw_default();
    TEST_FAILS(zr_adamw_cuda_update(&h, 1e-3f, 0, 1.0f, 1, (float *)d_a, (float *)d_a, (float *)d_a,
                                    (float *)d_a, 4, st),
               ZR_ERR_INVALID, "t >= 1");
}

int main(void)
{
    int n = 0;
    if (zr_device_cuda_count(&n) != ZR_OK) {
        return zr_test_skip("%s", zr_error_message());
    }
    zr_error_clear();
    TEST_OK(zr_device_open_cuda(0, &gpu));
    TEST_OK(zr_stream_create(&gpu, &st));
    TEST_OK(zr_device_alloc_at(&gpu, (void **)&d_a, DEV_BYTES, __FILE__, __LINE__));
    TEST_OK(zr_device_alloc_at(&gpu, (void **)&d_b, DEV_BYTES, __FILE__, __LINE__));
    TEST_OK(zr_device_alloc_at(&gpu, (void **)&d_c, DEV_BYTES, __FILE__, __LINE__));
    TEST_OK(zr_device_alloc_at(&gpu, (void **)&d_d, DEV_BYTES, __FILE__, __LINE__));
    char line[256];
    zr_device_describe(&gpu, line, sizeof line);
    printf("  device %s\n", line);
    if (st != NULL && d_d != NULL) {
        TEST_RUN(test_arguments);
        TEST_RUN(test_encode_small_groups);
        TEST_RUN(test_encode_large_groups);
        TEST_RUN(test_sum_requant);
    }
    zr_device_free(&gpu, d_a);
    zr_device_free(&gpu, d_b);
    zr_device_free(&gpu, d_c);
    zr_device_free(&gpu, d_d);
    zr_stream_destroy(st);
    return zr_test_finish();
}
