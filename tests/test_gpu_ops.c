/*
 * test_gpu_ops.c - GPT-2's CUDA operators (src/model/ops_cuda.h) against the
 * CPU operators (src/model/ops.h) and fp64 references, on small odd shapes.
 *
 * Runs on whatever CUDA device answers: the GPU emulator's (suite emu) or a
 * real GPU (suite gpu); without one it prints one line saying why and counts
 * as skipped. On a GPU the kernels are built with --fmad=true (multiply-adds
 * contract to FFMA; the emulator never contracts, so only the gpu suite
 * checks that): every bound below is the GPU-vs-CPU tolerance with
 * contraction, and the bit-identical claims are about additions only,
 * which contraction cannot change. Every bound is stated where it is
 * checked; in fp32 they are relative to the largest magnitude of the
 * reference tensor (elementwise operations that round once, as the CPU's,
 * must give the same bits):
 *
 *   embedding     forward bit-identical to zr_op_encoder_fwd (one addition);
 *                 backward within 1e-6 of zr_op_encoder_bwd (repeated tokens);
 *                 the host's token buckets exactly.
 *   LayerNorm     forward, fused residual + LayerNorm (the residual's bits
 *                 equal), backward (accumulating dinp, dw, db): within 2e-6
 *                 of zr_op_layernorm_fwd / _bwd_acc, C = 64 (16-byte
 *                 accesses) and C = 36 (element by element), 7 rows, the
 *                 row in registers (C <= 1024: 300, 768, 776) and streamed
 *                 (1030); the backward also C = 264 over 37 rows, 768,
 *                 770 (registers) and 1032 (streamed).
 *   bias, sums    bias add and residual bit-identical; column sums over 1 to
 *                 4103 rows (1 to 256 row ranges, widths 5 to 264: one and
 *                 two column blocks, 16-byte and element by element) within
 *                 1e-6 of an fp64 sum (bf16: plus 2^-8 of it), the scratch
 *                 poisoned with NaN, a second run the same bits.
 *   GELU          bias + GELU within 1e-6, its backward within 3e-6, of
 *                 fp64 tanh GELU.
 *   attention     output, dQ, dK, dV within 4e-6 (2e-7 per unit of the
 *                 largest score when that is over 20: large logits), the
 *                 log-sum-exp within 1e-6, of an fp64 softmax(QK^T/sqrt(hs)
 *                 + mask) V and its gradients: T = 1, T not a multiple of the
 *                 tile (9, 17, 19, 20, 33, 37, 130), head sizes 16, 24 (no
 *                 16-byte loads), 32, 64, 128, 256; bf16 within 1e-2; the
 *                 backward run twice gives the same bits (no atomics).
 *   softmax+xent  losses within 1e-6 relative of zr_op_softmax_xent_fwd,
 *                 dlogits within (1e-6 + 2^-22 max|logit|) dloss of its
 *                 backward (lse's own rounding), logits of order 1 and 1000;
 *                 padded columns never read, written 0 by the backward (the
 *                 classifier's GEMMs run over Vp); the mean loss within 1e-6;
 *                 V up to 3001 (three chunks a thread); the fused pass the
 *                 same bits as the two kernels, its outputs NaN-poisoned.
 *   arguments     NULL pointers, a CPU stream, a head size over 256 refused.
 */
#include "test.h"
#include "test_gpu.h"
#include "zr/model_cuda.h"

#include "../src/model/ops.h"      /* the CPU operators: internal to src/model */
#include "../src/model/ops_cuda.h" /* the CUDA operators: internal to src/model */

/* ---- device buffers ------------------------------------------------------------------ */

static void *dput_int(const int *x, size_t n)
{
    void *d = NULL;
    TEST_OK(zr_device_alloc_at(&gpu, &d, n * sizeof(int), __FILE__, __LINE__));
    TEST_OK(zr_memcpy_async(d, x, n * sizeof(int), st));
    TEST_OK(zr_stream_sync(st));
    return d;
}

static void dfree(void *d)
{
    zr_device_free(&gpu, d);
}

/* A NaN in every float of d[0..n-1] (scratch the kernels must write before they read). */
static void dpoison(float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        h[i] = NAN;
    }
    TEST_OK(zr_memcpy_async(d, h, n * sizeof(float), st));
    TEST_OK(zr_stream_sync(st));
    free(h);
}

/* x rounded as bf16 holds it (the inputs of a bf16 case, for the reference too). */
static void round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = zr_bf16_to_f32(zr_bf16_from_f32(x[i]));
    }
}

static void fill(zr_test_rng *rng, float *x, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = amp * zr_test_rng_uniform(rng);
    }
}

static double max_abs(const float *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    }
    return m;
}

/* Every |got - want| <= tol * (largest |want|, or 1 when that is 0); the first miss printed. */
static void check_close(const char *what, const float *got, const float *want, size_t n, double tol)
{
    double scale = max_abs(want, n), worst = 0.0;
    scale = scale > 0.0 ? scale : 1.0;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        if (!(err <= tol * scale)) {
            first = bad++ == 0 ? i : first;
        }
        worst = err > worst ? err : worst;
    }
    TEST_CHECKF(bad == 0,
                "%s: %zu of %zu elements beyond %.2g x %.3g (first at %zu: %.9g vs %.9g), worst "
                "error %.3g",
                what, bad, n, tol, scale, first, bad ? got[first] : 0.0, bad ? want[first] : 0.0,
                worst);
}

static void check_same(const char *what, const float *got, const float *want, size_t n)
{
    size_t i = 0;
    while (i < n && memcmp(&got[i], &want[i], sizeof(float)) == 0) {
        i++;
    }
    TEST_CHECKF(i == n, "%s: element %zu of %zu differs (%.9g vs %.9g)", what, i, n,
                i < n ? got[i] : 0.0, i < n ? want[i] : 0.0);
}

/* ---- embedding --------------------------------------------------------------------------- */

static void test_token_buckets(void)
{
    int inp[] = {5, 2, 5, 0, 2, 5, 7};
    int n = 7, V = 9, token[7], start[8], pos[7], count[9];
    int nb = zr_token_buckets(inp, n, V, token, start, pos, count);
    TEST_EQ_INT(nb, 4);
    int want_tok[] = {0, 2, 5, 7}, want_start[] = {0, 1, 3, 6, 7},
        want_pos[] = {3, 1, 4, 0, 2, 5, 6};
    for (int k = 0; k < nb; k++) {
        TEST_EQ_INT(token[k], want_tok[k]);
    }
    for (int k = 0; k <= nb; k++) {
        TEST_EQ_INT(start[k], want_start[k]);
    }
    for (int i = 0; i < n; i++) {
        TEST_EQ_INT(pos[i], want_pos[i]);
    }
}

static void encoder_case(int B, int T, int C, int V)
{
    zr_test_rng rng = {(uint64_t)(B * 1000 + T * 10 + C)};
    int BT = B * T;
    int *inp = malloc(BT * sizeof(int)), *count = malloc(V * sizeof(int));
    int *tok = malloc(BT * sizeof(int)), *start = malloc((BT + 1) * sizeof(int));
    int *pos = malloc(BT * sizeof(int));
    for (int i = 0; i < BT; i++) {
        inp[i] = (int)(zr_test_rng_next(&rng) % (uint64_t)(V / 2 + 1)); /* repeats */
    }
    float *wte = malloc((size_t)V * C * 4), *wpe = malloc((size_t)T * C * 4);
    float *out = malloc((size_t)BT * C * 4), *ref = malloc((size_t)BT * C * 4);
    float *dwte = malloc((size_t)V * C * 4), *dwpe = malloc((size_t)T * C * 4);
    float *gwte = malloc((size_t)V * C * 4), *gwpe = malloc((size_t)T * C * 4);
    fill(&rng, wte, (size_t)V * C, 1.0f);
    fill(&rng, wpe, (size_t)T * C, 1.0f);
    fill(&rng, out, (size_t)BT * C, 1.0f); /* the gradient flowing in */
    memcpy(dwte, wte, (size_t)V * C * 4);  /* accumulate onto something */
    memcpy(dwpe, wpe, (size_t)T * C * 4);
    void *d_inp = dput_int(inp, BT), *d_wte = dput(wte, (size_t)V * C, ZR_DTYPE_F32);
    void *d_wpe = dput(wpe, (size_t)T * C, ZR_DTYPE_F32);
    void *d_dout = dput(out, (size_t)BT * C, ZR_DTYPE_F32);
    void *d_out = dput(out, (size_t)BT * C, ZR_DTYPE_F32);
    TEST_OK(zr_op_cuda_encoder_fwd(ZR_DTYPE_F32, d_out, d_inp, d_wte, d_wpe, B, T, C, st));
    zr_op_encoder_fwd(ref, inp, wte, wpe, B, T, C);
    float *got = malloc((size_t)BT * C * 4);
    dget(got, d_out, (size_t)BT * C, ZR_DTYPE_F32);
    check_same("encoder forward", got, ref, (size_t)BT * C);
    int nb = zr_token_buckets(inp, BT, V, tok, start, pos, count);
    void *d_tok = dput_int(tok, nb > 0 ? nb : 1), *d_start = dput_int(start, nb + 1);
    void *d_pos = dput_int(pos, BT);
    TEST_OK(zr_op_cuda_encoder_bwd(ZR_DTYPE_F32, d_wte, d_wpe, d_dout, d_tok, d_start, d_pos, nb, B,
                                   T, C, st));
    zr_op_encoder_bwd(dwte, dwpe, out, inp, B, T, C);
    dget(gwte, d_wte, (size_t)V * C, ZR_DTYPE_F32);
    dget(gwpe, d_wpe, (size_t)T * C, ZR_DTYPE_F32);
    check_close("encoder backward dwte", gwte, dwte, (size_t)V * C, 1e-6);
    check_close("encoder backward dwpe", gwpe, dwpe, (size_t)T * C, 1e-6);
    void *ds[] = {d_inp, d_wte, d_wpe, d_dout, d_out, d_tok, d_start, d_pos};
    for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++) {
        dfree(ds[k]);
    }
    free(inp), free(count), free(tok), free(start), free(pos), free(wte), free(wpe);
    free(out), free(ref), free(dwte), free(dwpe), free(gwte), free(gwpe), free(got);
}

static void test_encoder(void)
{
    encoder_case(2, 5, 64, 11);
    encoder_case(3, 4, 36, 7);
    encoder_case(1, 1, 8, 3);
}

/* ---- LayerNorm ------------------------------------------------------------------------------ */

static void layernorm_case(int N, int C, zr_dtype t)
{
    zr_test_rng rng = {(uint64_t)(N * 100 + C)};
    size_t n = (size_t)N * C;
    float *a = malloc(n * 4), *x = malloc(n * 4), *xb = malloc(C * 4), *w = malloc(C * 4);
    float *b = malloc(C * 4), *res = malloc(n * 4), *out = malloc(n * 4), *got = malloc(n * 4);
    float mean[16], rstd[16], gmean[16], grstd[16];
    fill(&rng, a, n, 2.0f);
    fill(&rng, x, n, 1.0f);
    fill(&rng, xb, C, 0.5f);
    fill(&rng, w, C, 1.0f);
    fill(&rng, b, C, 0.3f);
    if (t == ZR_DTYPE_BF16) {
        round_bf16(a, n), round_bf16(x, n), round_bf16(xb, C), round_bf16(w, C), round_bf16(b, C);
    }
    double tol = t == ZR_DTYPE_BF16 ? 8e-3 : 2e-6;
    void *d_a = dput(a, n, t), *d_x = dput(x, n, t), *d_xb = dput(xb, C, t), *d_w = dput(w, C, t);
    void *d_b = dput(b, C, t), *d_res = dput(a, n, t), *d_out = dput(a, n, t);
    float *d_mean = dput(a, N, ZR_DTYPE_F32), *d_rstd = dput(a, N, ZR_DTYPE_F32);
    /* plain */
    TEST_OK(zr_op_cuda_layernorm_fwd(t, d_out, d_mean, d_rstd, d_a, d_w, d_b, N, C, st));
    zr_op_layernorm_fwd(out, mean, rstd, a, w, b, N, C);
    dget(got, d_out, n, t);
    dget(gmean, d_mean, N, ZR_DTYPE_F32);
    dget(grstd, d_rstd, N, ZR_DTYPE_F32);
    check_close("layernorm forward", got, out, n, tol);
    check_close("layernorm mean", gmean, mean, N, 1e-6);
    check_close("layernorm rstd", grstd, rstd, N, 1e-6);
    /* fused residual: res = a + (x + xb), its bits as the CPU's two additions */
    for (size_t i = 0; i < n; i++) {
        res[i] = a[i] + (x[i] + xb[i % C]);
    }
    if (t == ZR_DTYPE_BF16) {
        round_bf16(res, n);
    }
    TEST_OK(zr_op_cuda_residual_layernorm_fwd(t, d_res, d_out, d_mean, d_rstd, d_a, d_x, d_xb, d_w,
                                              d_b, N, C, st));
    zr_op_layernorm_fwd(out, mean, rstd, res, w, b, N, C);
    dget(got, d_res, n, t);
    check_same("residual of residual+layernorm", got, res, n);
    dget(got, d_out, n, t);
    check_close("residual+layernorm forward", got, out, n, tol);
    TEST_OK(zr_op_cuda_residual_fwd(t, d_out, d_a, d_x, d_xb, N, C, st));
    dget(got, d_out, n, t);
    check_same("residual forward", got, res, n);
    void *ds[] = {d_a, d_x, d_xb, d_w, d_b, d_res, d_out, d_mean, d_rstd};
    for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++) {
        dfree(ds[k]);
    }
    free(a), free(x), free(xb), free(w), free(b), free(res), free(out), free(got);
}

static void layernorm_bwd_case(int N, int C)
{
    zr_test_rng rng = {(uint64_t)(N * 7 + C)};
    size_t n = (size_t)N * C;
    float *x = malloc(n * 4), *d = malloc(n * 4), *dx = malloc(n * 4), *got = malloc(n * 4);
    float *w = malloc(C * 4), *b = malloc(C * 4), *dw = malloc(C * 4), *db = malloc(C * 4);
    float *ln = malloc(n * 4), *gw = malloc(C * 4), mean[64], rstd[64];
    fill(&rng, x, n, 2.0f);
    fill(&rng, d, n, 1.0f);
    fill(&rng, dx, n, 1.0f);
    fill(&rng, w, C, 1.0f);
    fill(&rng, b, C, 1.0f);
    fill(&rng, dw, C, 1.0f);
    fill(&rng, db, C, 1.0f);
    zr_op_layernorm_fwd(ln, mean, rstd, x, w, b, N, C);
    float *scratch = NULL;
    TEST_OK(zr_device_alloc_at(&gpu, (void **)&scratch,
                               zr_op_cuda_colsum_scratch(N, C) * sizeof(float), __FILE__,
                               __LINE__));
    dpoison(scratch, zr_op_cuda_colsum_scratch(N, C));
    void *d_x = dput(x, n, ZR_DTYPE_F32), *d_d = dput(d, n, ZR_DTYPE_F32);
    void *d_dx = dput(dx, n, ZR_DTYPE_F32), *d_w = dput(w, C, ZR_DTYPE_F32);
    void *d_dw = dput(dw, C, ZR_DTYPE_F32), *d_db = dput(db, C, ZR_DTYPE_F32);
    float *d_mean = dput(mean, N, ZR_DTYPE_F32), *d_rstd = dput(rstd, N, ZR_DTYPE_F32);
    TEST_OK(zr_op_cuda_layernorm_bwd(ZR_DTYPE_F32, d_dx, d_dw, d_db, d_d, d_x, d_w, d_mean, d_rstd,
                                     N, C, 1, scratch, st));
    zr_op_layernorm_bwd_acc(dx, dw, db, d, x, w, mean, rstd, N, C);
    dget(got, d_dx, n, ZR_DTYPE_F32);
    check_close("layernorm backward dinp", got, dx, n, 2e-6);
    dget(gw, d_dw, C, ZR_DTYPE_F32);
    check_close("layernorm backward dw", gw, dw, C, 2e-6);
    dget(gw, d_db, C, ZR_DTYPE_F32);
    check_close("layernorm backward db", gw, db, C, 2e-6);
    /* overwrite mode: dinp = the gradient alone */
    TEST_OK(zr_op_cuda_layernorm_bwd(ZR_DTYPE_F32, d_dx, d_dw, d_db, d_d, d_x, d_w, d_mean, d_rstd,
                                     N, C, 0, scratch, st));
    memset(dx, 0, n * 4);
    zr_op_layernorm_bwd_acc(dx, dw, db, d, x, w, mean, rstd, N, C);
    dget(got, d_dx, n, ZR_DTYPE_F32);
    check_close("layernorm backward dinp (not accumulated)", got, dx, n, 2e-6);
    void *ds[] = {d_x, d_d, d_dx, d_w, d_dw, d_db, d_mean, d_rstd, scratch};
    for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++) {
        dfree(ds[k]);
    }
    free(x), free(d), free(dx), free(got), free(w), free(b), free(dw), free(db), free(ln), free(gw);
}

static void test_layernorm(void)
{
    layernorm_case(7, 64, ZR_DTYPE_F32);
    layernorm_case(7, 36, ZR_DTYPE_F32);
    layernorm_case(5, 64, ZR_DTYPE_BF16);
    layernorm_case(7, 776, ZR_DTYPE_F32);  /* 4 chunks a lane in registers, the last short */
    layernorm_case(3, 300, ZR_DTYPE_BF16); /* 2 chunks a lane, element by element */
    layernorm_case(3, 1030, ZR_DTYPE_F32); /* above 1024: the streaming kernel */
    layernorm_case(3, 768, ZR_DTYPE_BF16); /* GPT-2's: 3 chunks a lane */
    layernorm_bwd_case(7, 64);
    layernorm_bwd_case(9, 36);
    layernorm_bwd_case(37, 264); /* two column blocks of the weight gradients */
    layernorm_bwd_case(5, 1032); /* above 1024: the streaming kernel */
    layernorm_bwd_case(5, 770);  /* 4 chunks a lane, element by element */
    layernorm_bwd_case(3, 768);  /* GPT-2's: 3 chunks a lane */
}

/* ---- bias, column sums, GELU ---------------------------------------------------------------- */

/*
 * db += column sums of d [N, OC]: within 1e-6 of the fp64 sum's magnitude
 * (bf16: plus one rounding of the result, 2^-8), the scratch poisoned with
 * NaN first, and a second run from the same db gives the same bits.
 */
static void colsum_case(int N, int OC, zr_dtype t)
{
    zr_test_rng rng = {(uint64_t)(N + OC)};
    size_t n = (size_t)N * OC;
    float *d = malloc(n * 4), *db = malloc(OC * 4), *got = malloc(n * 4), *ref = malloc(n * 4);
    float *again = malloc(OC * 4);
    double *acc = malloc(OC * sizeof(double)), *mag = malloc(OC * sizeof(double));
    fill(&rng, d, n, 1.0f);
    fill(&rng, db, OC, 1.0f);
    if (t == ZR_DTYPE_BF16) {
        round_bf16(d, n), round_bf16(db, OC);
    }
    float *scratch = NULL;
    size_t ns = zr_op_cuda_colsum_scratch(N, OC);
    TEST_OK(zr_device_alloc_at(&gpu, (void **)&scratch, ns * sizeof(float), __FILE__, __LINE__));
    dpoison(scratch, ns);
    void *d_d = dput(d, n, t), *d_db = dput(db, OC, t);
    TEST_OK(zr_op_cuda_colsum_acc(t, d_db, d_d, N, OC, scratch, st));
    dget(got, d_db, OC, t);
    int bad = 0;
    for (int j = 0; j < OC; j++) {
        acc[j] = db[j];
        mag[j] = fabs(db[j]);
        for (int i = 0; i < N; i++) {
            acc[j] += d[(size_t)i * OC + j];
            mag[j] += fabs(d[(size_t)i * OC + j]);
        }
        double tol = 1e-6 * mag[j] + (t == ZR_DTYPE_BF16 ? fabs(acc[j]) / 256.0 : 0.0);
        bad += !(fabs(got[j] - acc[j]) <= tol);
    }
    TEST_CHECKF(bad == 0, "column sums of %d x %d %s: %d columns beyond the bound", N, OC,
                zr_dtype_name(t), bad);
    dfree(d_db);
    d_db = dput(db, OC, t);
    TEST_OK(zr_op_cuda_colsum_acc(t, d_db, d_d, N, OC, scratch, st));
    dget(again, d_db, OC, t);
    TEST_CHECKF(memcmp(again, got, (size_t)OC * 4) == 0,
                "column sums of %d x %d: a second run gives other bits", N, OC);
    if (t == ZR_DTYPE_F32) { /* bias add: one addition, the CPU's bits */
        TEST_OK(zr_op_cuda_bias_add(ZR_DTYPE_F32, d_d, d_db, N, OC, st));
        for (size_t i = 0; i < n; i++) {
            ref[i] = d[i] + got[i % OC];
        }
        dget(got, d_d, n, ZR_DTYPE_F32);
        check_same("bias add", got, ref, n);
    }
    dfree(d_d), dfree(d_db), dfree(scratch);
    free(d), free(db), free(got), free(ref), free(acc), free(mag), free(again);
}

static double gelu64(double x)
{
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double dgelu64(double x)
{
    double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) +
           x * 0.5 * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_bias_gelu(void)
{
    colsum_case(1, 5, ZR_DTYPE_F32);
    colsum_case(7, 40, ZR_DTYPE_F32);
    colsum_case(100, 33, ZR_DTYPE_F32);
    colsum_case(300, 16, ZR_DTYPE_F32);
    colsum_case(1000, 264, ZR_DTYPE_F32); /* two column blocks, the second 8 wide; 63 ranges */
    colsum_case(333, 259, ZR_DTYPE_F32);  /* element by element, a short last chunk */
    colsum_case(4103, 24, ZR_DTYPE_F32);  /* 256 row ranges of 17 rows, the last short */
    colsum_case(301, 264, ZR_DTYPE_BF16);
    int N = 6, OC = 45;
    size_t n = (size_t)N * OC;
    zr_test_rng rng = {99};
    float *x = malloc(n * 4), *bias = malloc(OC * 4), *got = malloc(n * 4), *ref = malloc(n * 4);
    float *d = malloc(n * 4), *pre = malloc(n * 4);
    fill(&rng, x, n, 4.0f);
    x[0] = 30.0f, x[1] = -30.0f, x[2] = 0.0f, x[3] = 1e-4f; /* the ends and the middle */
    fill(&rng, bias, OC, 0.5f);
    bias[0] = bias[1] = bias[2] = bias[3] = 0.0f;
    fill(&rng, d, n, 1.0f);
    void *d_x = dput(x, n, ZR_DTYPE_F32), *d_b = dput(bias, OC, ZR_DTYPE_F32);
    void *d_out = dput(x, n, ZR_DTYPE_F32), *d_d = dput(d, n, ZR_DTYPE_F32);
    TEST_OK(zr_op_cuda_bias_gelu_fwd(ZR_DTYPE_F32, d_out, d_x, d_b, N, OC, st));
    for (size_t i = 0; i < n; i++) {
        pre[i] = x[i] + bias[i % OC];
        ref[i] = (float)gelu64(pre[i]);
    }
    dget(got, d_x, n, ZR_DTYPE_F32);
    check_same("bias + gelu: the stored pre-activation", got, pre, n);
    dget(got, d_out, n, ZR_DTYPE_F32);
    check_close("bias + gelu forward", got, ref, n, 1e-6);
    TEST_OK(zr_op_cuda_gelu_bwd(ZR_DTYPE_F32, d_d, d_x, d_d, n, st)); /* in place */
    for (size_t i = 0; i < n; i++) {
        ref[i] = (float)(dgelu64(pre[i]) * d[i]);
    }
    dget(got, d_d, n, ZR_DTYPE_F32);
    /* the tanh form 1 - 2/(exp(2u) + 1) (the CPU's too) is off by ~2^-24 near u = 0 */
    check_close("gelu backward", got, ref, n, 3e-6);
    dfree(d_x), dfree(d_b), dfree(d_out), dfree(d_d);
    free(x), free(bias), free(got), free(ref), free(d), free(pre);
}

/* ---- attention ------------------------------------------------------------------------------- */

typedef struct att_case {
    int B, T, C, NH;
    float amp; /* inputs uniform in [-amp, amp] */
    zr_dtype t;
    int twice; /* run the backward twice: the same bits */
} att_case;

/*
 * fp64 reference of causal attention and its gradients: out [B, T, C], lse
 * [B, NH, T], dqkv [B, T, 3C] from dout. Returns the largest |score|.
 */
static double attention_ref64(const float *qkv, const float *dout, int B, int T, int C, int NH,
                              float *out, float *lse, float *dqkv)
{
    int hs = C / NH, C3 = 3 * C;
    double scale = 1.0 / sqrt((double)hs), smax = 0.0;
    double *p = malloc(T * sizeof(double)), *dp = malloc(T * sizeof(double));
    memset(dqkv, 0, (size_t)B * T * C3 * sizeof(float));
    double *dacc = calloc((size_t)B * T * C3, sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
            double *dbase = dacc + (size_t)b * T * C3 + (size_t)h * hs;
            for (int i = 0; i < T; i++) {
                double m = -INFINITY, l = 0.0, D = 0.0;
                for (int j = 0; j <= i; j++) {
                    double s = 0.0;
                    for (int d = 0; d < hs; d++) {
                        s += (double)base[(size_t)i * C3 + d] * base[(size_t)j * C3 + C + d];
                    }
                    p[j] = s * scale;
                    m = p[j] > m ? p[j] : m;
                    smax = fabs(p[j]) > smax ? fabs(p[j]) : smax;
                }
                for (int j = 0; j <= i; j++) {
                    l += exp(p[j] - m);
                }
                for (int j = 0; j <= i; j++) {
                    p[j] = exp(p[j] - m) / l;
                }
                lse[((size_t)b * NH + h) * T + i] = (float)(m + log(l));
                const float *g = dout + ((size_t)b * T + i) * C + (size_t)h * hs;
                for (int d = 0; d < hs; d++) {
                    double o = 0.0;
                    for (int j = 0; j <= i; j++) {
                        o += p[j] * base[(size_t)j * C3 + 2 * C + d];
                    }
                    out[((size_t)b * T + i) * C + (size_t)h * hs + d] = (float)o;
                    D += o * g[d];
                }
                for (int j = 0; j <= i; j++) {
                    dp[j] = 0.0;
                    for (int d = 0; d < hs; d++) {
                        dp[j] += (double)g[d] * base[(size_t)j * C3 + 2 * C + d];
                        dbase[(size_t)j * C3 + 2 * C + d] += p[j] * g[d];
                    }
                    double ds = p[j] * (dp[j] - D) * scale;
                    for (int d = 0; d < hs; d++) {
                        dbase[(size_t)i * C3 + d] += ds * base[(size_t)j * C3 + C + d];
                        dbase[(size_t)j * C3 + C + d] += ds * base[(size_t)i * C3 + d];
                    }
                }
            }
        }
    }
    for (size_t i = 0; i < (size_t)B * T * C3; i++) {
        dqkv[i] = (float)dacc[i];
    }
    free(p), free(dp), free(dacc);
    return smax;
}

/* The q, k or v columns of dqkv [B*T, 3C] (part 0, 1, 2) into x [B*T, C]. */
static void qkv_part(float *x, const float *dqkv, int BT, int C, int part)
{
    for (int i = 0; i < BT; i++) {
        memcpy(x + (size_t)i * C, dqkv + (size_t)i * 3 * C + (size_t)part * C, C * sizeof(float));
    }
}

static void attention_case(const att_case *c)
{
    int B = c->B, T = c->T, C = c->C, NH = c->NH, BT = B * T;
    zr_test_rng rng = {(uint64_t)(B * 131 + T * 17 + C + NH + (int)c->amp)};
    size_t nq = (size_t)BT * 3 * C, no = (size_t)BT * C, nl = (size_t)B * NH * T;
    float *qkv = malloc(nq * 4), *dout = malloc(no * 4), *out = malloc(no * 4);
    float *lse = malloc(nl * 4), *dqkv = malloc(nq * 4), *got = malloc(nq * 4);
    float *g1 = malloc(nq * 4), *pr = malloc(no * 4), *pg = malloc(no * 4);
    fill(&rng, qkv, nq, c->amp);
    fill(&rng, dout, no, 1.0f);
    if (c->t == ZR_DTYPE_BF16) {
        round_bf16(qkv, nq);
        round_bf16(dout, no);
    }
    double smax = attention_ref64(qkv, dout, B, T, C, NH, out, lse, dqkv);
    /* fp32: a score's rounding, 2^-23 of its size, moves its probability as much */
    double tol = c->t == ZR_DTYPE_BF16 ? 1e-2 : fmax(4e-6, 2e-7 * smax);
    void *d_qkv = dput(qkv, nq, c->t), *d_dout = dput(dout, no, c->t);
    void *d_out = dput(out, no, c->t), *d_dqkv = dput(qkv, nq, c->t);
    float *d_lse = dput(lse, nl, ZR_DTYPE_F32), *d_delta = dput(lse, nl, ZR_DTYPE_F32);
    char what[160];
    snprintf(what, sizeof what, "attention B %d T %d C %d NH %d amp %g %s", B, T, C, NH, c->amp,
             zr_dtype_name(c->t));
    TEST_OK(zr_op_cuda_attention_fwd(c->t, d_out, d_lse, d_qkv, B, T, C, NH, st));
    dget(got, d_out, no, c->t);
    check_close(what, got, out, no, tol);
    dget(got, d_lse, nl, ZR_DTYPE_F32);
    check_close("... its log-sum-exp", got, lse, nl, c->t == ZR_DTYPE_BF16 ? 1e-2 : 1e-6);
    TEST_OK(zr_op_cuda_attention_bwd(c->t, d_dqkv, d_delta, d_dout, d_qkv, d_out, d_lse, B, T, C,
                                     NH, st));
    dget(got, d_dqkv, nq, c->t);
    static const char *names[3] = {"... dQ", "... dK", "... dV"};
    for (int part = 0; part < 3; part++) {
        qkv_part(pr, dqkv, BT, C, part);
        qkv_part(pg, got, BT, C, part);
        check_close(names[part], pg, pr, no, tol);
    }
    if (c->twice) { /* again: the same bits */
        TEST_OK(zr_op_cuda_attention_bwd(c->t, d_dqkv, d_delta, d_dout, d_qkv, d_out, d_lse, B, T,
                                         C, NH, st));
        dget(g1, d_dqkv, nq, c->t);
        TEST_CHECKF(memcmp(g1, got, nq * 4) == 0, "%s: the backward's second run differs", what);
    }
    dfree(d_qkv), dfree(d_dout), dfree(d_out), dfree(d_dqkv), dfree(d_lse), dfree(d_delta);
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(got), free(g1), free(pr);
    free(pg);
}

static void test_attention(void)
{
    static const att_case cases[] = {
        {2, 1, 64, 1, 1.0f, ZR_DTYPE_F32, 0},    /* T = 1, head size 64 */
        {1, 37, 64, 1, 1.0f, ZR_DTYPE_F32, 1},   /* hs 64: two query blocks, T % 32 != 0 */
        {1, 33, 64, 2, 1.0f, ZR_DTYPE_F32, 0},   /* hs 32 */
        {1, 20, 48, 2, 1.0f, ZR_DTYPE_F32, 0},   /* hs 24: no 16-byte loads */
        {1, 130, 32, 2, 1.0f, ZR_DTYPE_F32, 0},  /* hs 16: one lane a row, two blocks */
        {1, 17, 128, 1, 1.0f, ZR_DTYPE_F32, 0},  /* hs 128 */
        {1, 9, 256, 1, 0.5f, ZR_DTYPE_F32, 0},   /* hs 256: 16-row tiles */
        {1, 19, 64, 1, 12.0f, ZR_DTYPE_F32, 0},  /* large logits */
        {1, 20, 128, 2, 1.0f, ZR_DTYPE_BF16, 0}, /* bf16 storage */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        attention_case(&cases[i]);
    }
}

/* ---- softmax + cross-entropy ------------------------------------------------------------------
 */

static void xent_case(int N, int V, int Vp, float amp, zr_dtype t)
{
    zr_test_rng rng = {(uint64_t)(N * V + Vp + (int)amp)};
    size_t n = (size_t)N * Vp;
    float *logits = malloc(n * 4), *probs = malloc(n * 4), *got = malloc(n * 4);
    float losses[16], glosses[16], lse[16], mean = 0.0f;
    int targets[16];
    for (int i = 0; i < 16; i++) {
        lse[i] = NAN; /* the outputs' poison */
    }
    fill(&rng, logits, n, amp);
    for (int i = 0; i < N; i++) {
        targets[i] = (int)(zr_test_rng_next(&rng) % (uint64_t)V);
        for (int j = V; j < Vp; j++) {
            logits[(size_t)i * Vp + j] = 12345.0f; /* padding: never read, written 0 */
        }
    }
    if (t == ZR_DTYPE_BF16) {
        round_bf16(logits, n);
    }
    memcpy(probs, logits, n * 4);
    zr_op_softmax_xent_fwd(probs, losses, targets, N, V, Vp);
    float dloss = 1.0f / (float)N;
    zr_op_softmax_xent_bwd(probs, targets, dloss, N, V, Vp);
    for (int i = 0; i < N; i++) {
        for (int j = V; j < Vp; j++) {
            probs[(size_t)i * Vp + j] = 0.0f;
        }
    }
    void *d_logits = dput(logits, n, t), *d_tgt = dput_int(targets, N);
    float *d_losses = dput(lse, N, ZR_DTYPE_F32), *d_lse = dput(lse, N, ZR_DTYPE_F32);
    float *d_mean = dput(lse, 1, ZR_DTYPE_F32);
    TEST_OK(zr_op_cuda_xent_fwd(t, d_losses, d_lse, d_logits, d_tgt, N, V, Vp, st));
    TEST_OK(zr_op_cuda_mean(d_mean, d_losses, N, st));
    dget(glosses, d_losses, N, ZR_DTYPE_F32);
    dget(&mean, d_mean, 1, ZR_DTYPE_F32);
    char what[128];
    snprintf(what, sizeof what, "xent N %d V %d Vp %d amp %g %s: losses", N, V, Vp, amp,
             zr_dtype_name(t));
    check_close(what, glosses, losses, N, 1e-6);
    double sum = 0.0;
    for (int i = 0; i < N; i++) {
        sum += losses[i];
    }
    TEST_NEAR(mean, sum / N, 1e-6 * fabs(sum / N));
    TEST_OK(zr_op_cuda_xent_bwd(t, d_logits, d_lse, d_tgt, dloss, N, V, Vp, st));
    dget(got, d_logits, n, t);
    /*
     * within (1e-6 + 2^-22 amp) dloss: exp(x - lse) carries lse's rounding,
     * 2^-24 of |lse| <= amp + log V, relatively (bf16: one rounding of a
     * value below dloss, 2^-8 of it)
     */
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = (t == ZR_DTYPE_BF16 ? 8e-3 : 1e-6 + 2.4e-7 * amp) * dloss;
        bad += !(fabs(got[i] - probs[i]) <= tol);
    }
    TEST_CHECKF(bad == 0, "%s: %d dlogits beyond the bound (or a padded column not 0)", what, bad);
    /* the fused pass: the same bits as forward then backward, outputs poisoned first */
    float glse[16], flse[16], flosses[16];
    float *fused = malloc(n * 4);
    dget(glse, d_lse, N, ZR_DTYPE_F32);
    void *d_l2 = dput(logits, n, t);
    float *d_fl = dput(lse, N, ZR_DTYPE_F32), *d_flse = dput(lse, N, ZR_DTYPE_F32);
    TEST_OK(zr_op_cuda_xent_fused(t, d_fl, d_flse, d_l2, d_tgt, dloss, N, V, Vp, st));
    dget(fused, d_l2, n, t);
    dget(flosses, d_fl, N, ZR_DTYPE_F32);
    dget(flse, d_flse, N, ZR_DTYPE_F32);
    check_same("xent fused: dlogits", fused, got, n);
    check_same("xent fused: losses", flosses, glosses, N);
    check_same("xent fused: lse", flse, glse, N);
    dfree(d_l2), dfree(d_fl), dfree(d_flse);
    free(fused);
    dfree(d_logits), dfree(d_tgt), dfree(d_losses), dfree(d_lse), dfree(d_mean);
    free(logits), free(probs), free(got);
}

static void test_xent(void)
{
    xent_case(7, 97, 112, 1.0f, ZR_DTYPE_F32);    /* 16-byte accesses */
    xent_case(5, 97, 100, 3.0f, ZR_DTYPE_F32);    /* element by element */
    xent_case(6, 97, 112, 1000.0f, ZR_DTYPE_F32); /* large logits */
    xent_case(1, 1, 8, 1.0f, ZR_DTYPE_F32);
    xent_case(7, 97, 128, 2.0f, ZR_DTYPE_BF16);
    xent_case(3, 3001, 3008, 2.0f, ZR_DTYPE_F32); /* three chunks a thread, the last short */
    xent_case(3, 2999, 3001, 2.0f, ZR_DTYPE_F32); /* element by element */
    xent_case(2, 3001, 3008, 4.0f, ZR_DTYPE_BF16);
}

/* ---- arguments ------------------------------------------------------------------------------ */

static void test_arguments(void)
{
    float x[4] = {0};
    void *d = dput(x, 4, ZR_DTYPE_F32);
    TEST_FAILS(zr_op_cuda_layernorm_fwd(ZR_DTYPE_F32, d, NULL, d, d, d, d, 1, 4, st),
               ZR_ERR_INVALID, "pointer argument 2 is NULL");
    TEST_FAILS(zr_op_cuda_attention_fwd(ZR_DTYPE_F32, d, d, d, 1, 1, 1024, 2, st), ZR_ERR_INVALID,
               "head size 512");
    TEST_FAILS(zr_op_cuda_attention_fwd(ZR_DTYPE_F32, d, d, d, 1, 1, 30, 4, st), ZR_ERR_INVALID,
               "a multiple of NH");
    TEST_FAILS(zr_op_cuda_xent_fwd(ZR_DTYPE_F32, d, d, d, NULL, 1, 9, 8, st), ZR_ERR_INVALID,
               "Vp >= V");
    TEST_FAILS(zr_op_cuda_bias_add((zr_dtype)9, d, d, 1, 1, st), ZR_ERR_INVALID,
               "neither fp32 nor bf16");
    zr_device cpu = zr_device_cpu();
    zr_stream *cs = NULL;
    TEST_OK(zr_stream_create(&cpu, &cs));
    TEST_FAILS(zr_op_cuda_gelu_bwd(ZR_DTYPE_F32, d, d, d, 4, cs), ZR_ERR_INVALID,
               "got a CPU stream");
    zr_stream_destroy(cs);
    dfree(d);
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
    char line[256];
    zr_device_describe(&gpu, line, sizeof line);
    printf("  device %s\n", line);
    if (st != NULL) {
        TEST_RUN(test_token_buckets);
        TEST_RUN(test_encoder);
        TEST_RUN(test_layernorm);
        TEST_RUN(test_bias_gelu);
        TEST_RUN(test_attention);
        TEST_RUN(test_xent);
        TEST_RUN(test_arguments);
    }
    zr_stream_destroy(st);
    return zr_test_finish();
}
