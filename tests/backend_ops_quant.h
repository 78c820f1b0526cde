/*
 * backend_ops_quant.h - the casts, the engine's elementwise folds and the
 * optimizer in test_backend_ops' table: each op's case against the CPU
 * function, bit for bit (NaN payloads aside where arithmetic makes the NaN:
 * each processor has its own). Included once, by test_backend_ops.c.
 */
#ifndef ZR_TEST_BACKEND_OPS_QUANT_H
#define ZR_TEST_BACKEND_OPS_QUANT_H

static float u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x[0..n-1] normal, and with `specials` one special value in every 7 (NaN, Inf, denormal, ...). */
static void fill_special(zr_test_rng *rng, float *x, size_t n, int specials)
{
    static const uint32_t sp[] = {0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u,
                                  0x00000001u, 0x80000001u, 0x007fffffu, 0x80000000u,
                                  0x7f7fffffu, 0xff7fffffu, 0x7f800001u};
    for (size_t i = 0; i < n; i++) {
        x[i] = zr_test_rng_normal(rng);
        if (specials && i % 7 == 3) {
            x[i] = u2f(sp[(i / 7) % (sizeof sp / sizeof sp[0])]);
        }
    }
}

/* a backend fp32 buffer of n + off floats: x at element off */
static float *bput_at(ops_backend *be, const float *x, size_t n, size_t off)
{
    float *d = be->alloc((n + off) * 4 + 4);
    be->put(d + off, x, n * 4);
    return d;
}

/*
 * a = n, b = offset (elements; 2: no 16-byte accesses): fp32 -> bf16 of every
 * bf16's neighbourhood then random bit patterns, and every bf16 -> fp32
 */
static int run_bf16_casts(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->bf16_from_f32 == NULL || be->bf16_to_f32 == NULL) {
        return 0;
    }
    size_t n = (size_t)r->a, off = (size_t)r->b;
    zr_bf16 *h = malloc(n * 2 + 2), *hr = malloc(n * 2 + 2);
    float *f = malloc(n * 4 + 4), *want = malloc(n * 4 + 4), *got = malloc(n * 4 + 4);
    zr_test_rng rng = {31};
    for (size_t i = 0; i < n; i++) {
        h[i] = (zr_bf16)i; /* every bf16, then some again */
        f[i] = u2f(i < 65536 ? (uint32_t)i << 16 | (uint32_t)(zr_test_rng_next(&rng) & 0xffff)
                             : (uint32_t)zr_test_rng_next(&rng));
    }
    float *d_f = bput_at(be, f, n, off);
    zr_bf16 *d_h = be->alloc((n + off) * 2 + 2);
    TEST_OK(be->bf16_from_f32(d_h + off, d_f + off, n, be->stream));
    zr_bf16_from_f32_n(hr, f, n);
    zr_bf16_to_f32_n(want, hr, n); /* widening is exact: the same bits iff the same bf16 */
    bget(be, got, d_h + off, n, ZR_DTYPE_BF16);
    check("fp32 -> bf16", r, got, want, n, row_tol(op, r));
    be->put(d_h + off, h, n * 2);
    TEST_OK(be->bf16_to_f32(d_f + off, d_h + off, n, be->stream));
    zr_bf16_to_f32_n(want, h, n);
    bget(be, got, d_f + off, n, ZR_DTYPE_F32);
    check("bf16 -> fp32", r, got, want, n, row_tol(op, r));
    be->free(d_f), be->free(d_h);
    free(h), free(hr), free(f), free(want), free(got);
    return 1;
}

/* a = n, b = offset, c = specials in acc: acc += x (x fp32 or bf16), elements outside untouched */
static int run_add(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->add == NULL) {
        return 0;
    }
    size_t n = (size_t)r->a, off = (size_t)r->b, nn = n + off + 1;
    zr_test_rng rng = {(uint64_t)(9 + n)};
    float *acc = malloc(nn * 4), *x = malloc(nn * 4), *got = malloc(nn * 4);
    fill_special(&rng, acc, nn, r->c);
    fill_special(&rng, x, nn, 0);
    if (r->t == ZR_DTYPE_BF16) {
        round_bf16(x, nn);
    }
    float *d_acc = bput_at(be, acc, nn, 0);
    char *d_x = bput(be, x, nn, r->t);
    TEST_OK(be->add(d_acc + off, d_x + off * zr_dtype_size(r->t), r->t, n, be->stream));
    for (size_t i = off; i < off + n; i++) {
        acc[i] += x[i];
    }
    bget(be, got, d_acc, nn, ZR_DTYPE_F32);
    check("acc + x", r, got, acc, nn, row_tol(op, r));
    be->free(d_acc), be->free(d_x);
    free(acc), free(x), free(got);
    return 1;
}

/*
 * a = n, b = stride beyond n, c = specials: out = (rank 0 + rank 1 + ...) / k
 * for k = 1, 3, 5, 7, the CPU's reduce-scatter order
 */
static int run_sum_ranks(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->sum_ranks == NULL) {
        return 0;
    }
    size_t n = (size_t)r->a, stride = n + (size_t)r->b, nn = n ? n : 1;
    zr_test_rng rng = {(uint64_t)(5 + n)};
    for (int k = 1; k <= 7; k += 2) {
        size_t rows_n = (size_t)k * (stride ? stride : 1);
        float *in = malloc(rows_n * 4), *want = malloc(nn * 4), *got = malloc(nn * 4);
        fill_special(&rng, in, rows_n, r->c);
        if (r->t == ZR_DTYPE_BF16) {
            round_bf16(in, rows_n);
        }
        for (size_t i = 0; i < n; i++) {
            float o = in[i];
            for (int p = 1; p < k; p++) {
                o += in[(size_t)p * stride + i];
            }
            want[i] = o / (float)k;
        }
        void *d_in = bput(be, in, rows_n, r->t), *d_out = be->alloc(nn * 4);
        TEST_OK(be->sum_ranks(d_out, d_in, r->t, k, stride, n, (float)k, be->stream));
        bget(be, got, d_out, n, ZR_DTYPE_F32);
        check(k == 1   ? "k 1"
              : k == 3 ? "k 3"
              : k == 5 ? "k 5"
                       : "k 7",
              r, got, want, n, row_tol(op, r));
        be->free(d_in), be->free(d_out);
        free(in), free(want), free(got);
    }
    return 1;
}

/*
 * a = n, b = offset: three AdamW steps (the second with grad scale 0.5, the
 * third without decay) against zr_adamw_update's scalar kernel; gradients
 * with NaN, Inf, a denormal, -0 and FLT_MAX among them
 */
static int run_adamw(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->adamw_update == NULL) {
        return 0;
    }
    size_t n = (size_t)r->a, off = (size_t)r->b, nn = n + 1;
    zr_test_rng rng = {(uint64_t)(11 + n)};
    zr_adamw h = zr_adamw_default();
    float *a[4], *d[4], *got = malloc(nn * 4);
    for (int j = 0; j < 4; j++) {
        a[j] = malloc(nn * 4);
    }
    static const uint32_t sp[] = {0x7fc00000u, 0x7f800000u, 0x00000001u, 0x80000000u, 0x7f7fffffu};
    for (size_t i = 0; i < n; i++) {
        a[0][i] = zr_test_rng_normal(&rng);
        a[1][i] = i % 13 == 5 ? u2f(sp[i % 5]) : zr_test_rng_normal(&rng) * 0.01f;
        a[2][i] = zr_test_rng_uniform(&rng) * 0.001f;
        a[3][i] = fabsf(zr_test_rng_uniform(&rng)) * 1e-6f;
    }
    for (int j = 0; j < 4; j++) {
        d[j] = bput_at(be, a[j], n, off);
    }
    TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_SCALAR));
    for (int step = 1; step <= 3; step++) {
        float lr = 1e-3f * (float)step, gs = step == 2 ? 0.5f : 1.0f;
        zr_adamw_update(&h, lr, step, gs, step != 3, a[0], a[1], a[2], a[3], n);
        TEST_OK(be->adamw_update(&h, lr, step, gs, step != 3, d[0] + off, d[1] + off, d[2] + off,
                                 d[3] + off, n, be->stream));
    }
    TEST_OK(zr_optim_set_impl(ZR_OPTIM_IMPL_AUTO));
    static const char *names[4] = {"param", "grad", "m", "v"};
    for (int j = 0; j < 4; j++) {
        bget(be, got, d[j] + off, n, ZR_DTYPE_F32);
        check(names[j], r, got, a[j], n, row_tol(op, r));
        be->free(d[j]);
        free(a[j]);
    }
    free(got);
    return 1;
}

/*
 * a = n, b = offset, c = a NaN at x[3]: the sum of squares in double against
 * zr_sumsq_cuda_order (the device's order, bit for bit) and zr_sumsq (1e-12)
 */
static int run_sumsq(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->sumsq == NULL) {
        return 0;
    }
    size_t n = (size_t)r->a, off = (size_t)r->b;
    zr_test_rng rng = {13};
    float *x = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) {
        x[i] = zr_test_rng_normal(&rng) * (i % 1000 == 7 ? 1e20f : 1.0f);
    }
    if (r->c && n > 3) {
        x[3] = NAN;
    }
    float *d_x = bput_at(be, x, n, off);
    double *d_res = be->alloc(sizeof(double)), *d_work = be->alloc(ZR_SUMSQ_CUDA_WORK * 8);
    TEST_OK(be->sumsq(d_x + off, n, d_res, d_work, be->stream));
    double got = -1.0, want = zr_sumsq_cuda_order(x, n), cpu = zr_sumsq(x, n);
    be->get(&got, d_res, sizeof got);
    ops_cases++;
    TEST_CHECKF(memcmp(&got, &want, sizeof got) == 0 || (isnan(got) && isnan(want)),
                "sumsq n %zu offset %zu: %.17g vs the CPU in the same order %.17g", n, off, got,
                want);
    TEST_CHECKF(fabs(got - cpu) <= op->tol[0] * cpu || (isnan(got) && isnan(cpu)),
                "sumsq n %zu: %.17g vs zr_sumsq %.17g", n, got, cpu);
    be->free(d_x), be->free(d_res), be->free(d_work);
    free(x);
    return 1;
}

#endif
