/*
 * backend_ops_model.h - GPT-2's operators in test_backend_ops' table: each
 * op's case (inputs, the CPU side, the backend's entry point, comparisons),
 * the ops with their tolerances, the rows, and the checks that are not a
 * backend-versus-CPU comparison. Included once, by test_backend_ops.c.
 */
#ifndef ZR_TEST_BACKEND_OPS_MODEL_H
#define ZR_TEST_BACKEND_OPS_MODEL_H

/* ---- embedding ------------------------------------------------------------------------------- */

/* a = B, b = T, c = C, d = V: tokens with repeats; forward, then backward through the buckets */
static int run_encoder(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->encoder_fwd == NULL || be->ops->encoder_bwd == NULL) {
        return 0;
    }
    int B = r->a, T = r->b, C = r->c, V = r->d, BT = B * T;
    zr_test_rng rng = {(uint64_t)(B * 1000 + T * 10 + C)};
    int *inp = malloc(BT * sizeof(int)), *count = malloc(V * sizeof(int));
    int *tok = malloc(BT * sizeof(int)), *start = malloc((BT + 1) * sizeof(int));
    int *pos = malloc(BT * sizeof(int));
    for (int i = 0; i < BT; i++) {
        inp[i] = (int)(zr_test_rng_next(&rng) % (uint64_t)(V / 2 + 1));
    }
    size_t nw = (size_t)V * C, np = (size_t)T * C, no = (size_t)BT * C;
    float *wte = malloc(nw * 4), *wpe = malloc(np * 4), *dout = malloc(no * 4);
    float *ref = malloc(no * 4), *got = malloc((nw > no ? nw : no) * 4);
    fill(&rng, wte, nw, 1.0f);
    fill(&rng, wpe, np, 1.0f);
    fill(&rng, dout, no, 1.0f);
    void *d_inp = bput_int(be, inp, BT), *d_wte = bput(be, wte, nw, r->t);
    void *d_wpe = bput(be, wpe, np, r->t), *d_dout = bput(be, dout, no, r->t);
    void *d_out = bput(be, dout, no, r->t);
    TEST_OK(be->ops->encoder_fwd(r->t, d_out, d_inp, d_wte, d_wpe, B, T, C, be->stream));
    zr_op_encoder_fwd(ref, inp, wte, wpe, B, T, C);
    bget(be, got, d_out, no, r->t);
    check("forward (one addition)", r, got, ref, no, SAME_BITS);
    int nb = zr_token_buckets(inp, BT, V, tok, start, pos, count);
    void *d_tok = bput_int(be, tok, nb > 0 ? nb : 1), *d_start = bput_int(be, start, nb + 1);
    void *d_pos = bput_int(be, pos, BT);
    TEST_OK(be->ops->encoder_bwd(r->t, d_wte, d_wpe, d_dout, d_tok, d_start, d_pos, nb, B, T, C,
                                 be->stream));
    zr_op_encoder_bwd(wte, wpe, dout, inp, B, T, C); /* accumulates onto the weights */
    bget(be, got, d_wte, nw, r->t);
    check("backward dwte", r, got, wte, nw, row_tol(op, r));
    bget(be, got, d_wpe, np, r->t);
    check("backward dwpe", r, got, wpe, np, row_tol(op, r));
    void *ds[] = {d_inp, d_wte, d_wpe, d_dout, d_out, d_tok, d_start, d_pos};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(inp), free(count), free(tok), free(start), free(pos), free(wte), free(wpe);
    free(dout), free(ref), free(got);
    return 1;
}

/* ---- LayerNorm ------------------------------------------------------------------------------- */

/* a = N rows, b = C: LayerNorm forward, mean and rstd within 1e-6 in either precision */
static int run_layernorm(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->layernorm_fwd == NULL) {
        return 0;
    }
    int N = r->a, C = r->b;
    size_t n = (size_t)N * C;
    zr_test_rng rng = {(uint64_t)(N * 100 + C)};
    float *a = malloc(n * 4), *w = malloc(C * 4), *b = malloc(C * 4), *out = malloc(n * 4);
    float *got = malloc(n * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    fill_t(&rng, a, n, 2.0f, r->t);
    fill_t(&rng, w, C, 1.0f, r->t);
    fill_t(&rng, b, C, 0.3f, r->t);
    void *d_a = bput(be, a, n, r->t), *d_w = bput(be, w, C, r->t), *d_b = bput(be, b, C, r->t);
    void *d_out = bpoison(be, n), *d_mean = bpoison(be, N), *d_rstd = bpoison(be, N);
    TEST_OK(be->ops->layernorm_fwd(r->t, d_out, d_mean, d_rstd, d_a, d_w, d_b, N, C, be->stream));
    zr_op_layernorm_fwd(out, mean, rstd, a, w, b, N, C);
    bget(be, got, d_out, n, r->t);
    check("out", r, got, out, n, row_tol(op, r));
    bget(be, got, d_mean, N, ZR_DTYPE_F32);
    check("mean", r, got, mean, N, 1e-6);
    bget(be, got, d_rstd, N, ZR_DTYPE_F32);
    check("rstd", r, got, rstd, N, 1e-6);
    void *ds[] = {d_a, d_w, d_b, d_out, d_mean, d_rstd};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(a), free(w), free(b), free(out), free(got), free(mean), free(rstd);
    return 1;
}

/*
 * a = N, b = C: res = a + (x + xbias) from the fused residual + LayerNorm and
 * from the residual alone, the CPU's two additions' bits; the LayerNorm of res
 */
static int run_residual_layernorm(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->residual_layernorm_fwd == NULL || be->ops->residual_fwd == NULL) {
        return 0;
    }
    int N = r->a, C = r->b;
    size_t n = (size_t)N * C;
    zr_test_rng rng = {(uint64_t)(N * 100 + C + 1)};
    float *a = malloc(n * 4), *x = malloc(n * 4), *xb = malloc(C * 4), *w = malloc(C * 4);
    float *b = malloc(C * 4), *res = malloc(n * 4), *out = malloc(n * 4), *got = malloc(n * 4);
    float *mean = malloc(N * 4), *rstd = malloc(N * 4);
    fill_t(&rng, a, n, 2.0f, r->t);
    fill_t(&rng, x, n, 1.0f, r->t);
    fill_t(&rng, xb, C, 0.5f, r->t);
    fill_t(&rng, w, C, 1.0f, r->t);
    fill_t(&rng, b, C, 0.3f, r->t);
    zr_op_residual_layernorm_fwd(res, out, mean, rstd, a, x, xb, w, b, N, C);
    if (r->t == ZR_DTYPE_BF16) { /* stored as bf16, then normalised from what is stored */
        round_bf16(res, n);
        zr_op_layernorm_fwd(out, mean, rstd, res, w, b, N, C);
    }
    void *d_a = bput(be, a, n, r->t), *d_x = bput(be, x, n, r->t), *d_xb = bput(be, xb, C, r->t);
    void *d_w = bput(be, w, C, r->t), *d_b = bput(be, b, C, r->t);
    void *d_res = bput(be, a, n, r->t), *d_out = bput(be, a, n, r->t);
    void *d_mean = bpoison(be, N), *d_rstd = bpoison(be, N);
    TEST_OK(be->ops->residual_layernorm_fwd(r->t, d_res, d_out, d_mean, d_rstd, d_a, d_x, d_xb, d_w,
                                            d_b, N, C, be->stream));
    bget(be, got, d_res, n, r->t);
    check("residual (two additions)", r, got, res, n, SAME_BITS);
    bget(be, got, d_out, n, r->t);
    check("out", r, got, out, n, row_tol(op, r));
    TEST_OK(be->ops->residual_fwd(r->t, d_out, d_a, d_x, d_xb, N, C, be->stream));
    bget(be, got, d_out, n, r->t);
    check("residual alone (two additions)", r, got, res, n, SAME_BITS);
    void *ds[] = {d_a, d_x, d_xb, d_w, d_b, d_res, d_out, d_mean, d_rstd};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(a), free(x), free(xb), free(w), free(b), free(res), free(out), free(got), free(mean);
    free(rstd);
    return 1;
}

/* a = N, b = C: dinp (accumulated, then overwritten), dw and db accumulated */
static int run_layernorm_bwd(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->layernorm_bwd == NULL) {
        return 0;
    }
    int N = r->a, C = r->b;
    size_t n = (size_t)N * C, ns = zr_op_colsum_scratch(N, C);
    zr_test_rng rng = {(uint64_t)(N * 7 + C)};
    float *x = malloc(n * 4), *d = malloc(n * 4), *dx = malloc(n * 4), *got = malloc(n * 4);
    float *w = malloc(C * 4), *b = malloc(C * 4), *dw = malloc(C * 4), *db = malloc(C * 4);
    float *ln = malloc(n * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    fill(&rng, x, n, 2.0f);
    fill(&rng, d, n, 1.0f);
    fill(&rng, dx, n, 1.0f);
    fill(&rng, w, C, 1.0f);
    fill(&rng, b, C, 1.0f);
    fill(&rng, dw, C, 1.0f);
    fill(&rng, db, C, 1.0f);
    zr_op_layernorm_fwd(ln, mean, rstd, x, w, b, N, C);
    void *scratch = bpoison(be, ns), *d_x = bput(be, x, n, r->t), *d_d = bput(be, d, n, r->t);
    void *d_dx = bput(be, dx, n, r->t), *d_w = bput(be, w, C, r->t);
    void *d_dw = bput(be, dw, C, r->t), *d_db = bput(be, db, C, r->t);
    void *d_mean = bput(be, mean, N, ZR_DTYPE_F32), *d_rstd = bput(be, rstd, N, ZR_DTYPE_F32);
    double tol = row_tol(op, r);
    for (int acc = 1; acc >= 0; acc--) {
        TEST_OK(be->ops->layernorm_bwd(r->t, d_dx, d_dw, d_db, d_d, d_x, d_w, d_mean, d_rstd, N, C,
                                       acc, scratch, be->stream));
        if (!acc) {
            memset(dx, 0, n * 4);
        }
        zr_op_layernorm_bwd_acc(dx, dw, db, d, x, w, mean, rstd, N, C);
        bget(be, got, d_dx, n, r->t);
        check(acc ? "dinp (accumulated)" : "dinp (overwritten)", r, got, dx, n, tol);
        bget(be, got, d_dw, C, r->t);
        check("dw", r, got, dw, C, tol);
        bget(be, got, d_db, C, r->t);
        check("db", r, got, db, C, tol);
    }
    void *ds[] = {d_x, d_d, d_dx, d_w, d_dw, d_db, d_mean, d_rstd, scratch};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(x), free(d), free(dx), free(got), free(w), free(b), free(dw), free(db), free(ln);
    free(mean), free(rstd);
    return 1;
}

/* ---- bias, column sums, GELU ----------------------------------------------------------------- */

/* a = N, b = OC: x += bias row by row, one addition each: the CPU's bits */
static int run_bias_add(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->bias_add == NULL) {
        return 0;
    }
    int N = r->a, OC = r->b;
    size_t n = (size_t)N * OC;
    zr_test_rng rng = {(uint64_t)(N + OC)};
    float *x = malloc(n * 4), *bias = malloc(OC * 4), *got = malloc(n * 4);
    fill_t(&rng, x, n, 1.0f, r->t);
    fill_t(&rng, bias, OC, 1.0f, r->t);
    void *d_x = bput(be, x, n, r->t), *d_b = bput(be, bias, OC, r->t);
    TEST_OK(be->ops->bias_add(r->t, d_x, d_b, N, OC, be->stream));
    for (size_t i = 0; i < n; i++) {
        x[i] += bias[i % OC];
    }
    if (r->t == ZR_DTYPE_BF16) {
        round_bf16(x, n);
    }
    bget(be, got, d_x, n, r->t);
    check("x + bias", r, got, x, n, row_tol(op, r));
    be->free(d_x), be->free(d_b);
    free(x), free(bias), free(got);
    return 1;
}

/*
 * a = N, b = OC: db += the column sums of d, against an fp64 sum: within tol
 * of the column's sum of magnitudes (bf16: plus one rounding of the result,
 * 2^-8 of it), the scratch poisoned
 */
static int run_colsum(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->colsum_acc == NULL) {
        return 0;
    }
    int N = r->a, OC = r->b;
    size_t n = (size_t)N * OC;
    zr_test_rng rng = {(uint64_t)(N + OC)};
    float *d = malloc(n * 4), *db = malloc(OC * 4), *got = malloc(OC * 4);
    fill_t(&rng, d, n, 1.0f, r->t);
    fill_t(&rng, db, OC, 1.0f, r->t);
    void *scratch = bpoison(be, zr_op_colsum_scratch(N, OC));
    void *d_d = bput(be, d, n, r->t), *d_db = bput(be, db, OC, r->t);
    TEST_OK(be->ops->colsum_acc(r->t, d_db, d_d, N, OC, scratch, be->stream));
    bget(be, got, d_db, OC, r->t);
    int bad = 0;
    for (int j = 0; j < OC; j++) {
        double acc = db[j], mag = fabs(db[j]);
        for (int i = 0; i < N; i++) {
            acc += d[(size_t)i * OC + j];
            mag += fabs(d[(size_t)i * OC + j]);
        }
        double tol = op->tol[0] * mag + (r->t == ZR_DTYPE_BF16 ? fabs(acc) / 256.0 : 0.0);
        bad += !(fabs(got[j] - acc) <= tol);
    }
    ops_cases++;
    TEST_CHECKF(bad == 0, "colsum %d x %d %s: %d columns beyond the bound", N, OC,
                zr_dtype_name(r->t), bad);
    /* a second run from the same db: the same bits */
    be->free(d_db);
    d_db = bput(be, db, OC, r->t);
    TEST_OK(be->ops->colsum_acc(r->t, d_db, d_d, N, OC, scratch, be->stream));
    bget(be, db, d_db, OC, r->t);
    TEST_CHECKF(memcmp(db, got, (size_t)OC * 4) == 0, "colsum %d x %d: a second run differs", N,
                OC);
    be->free(scratch), be->free(d_d), be->free(d_db);
    free(d), free(db), free(got);
    return 1;
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

/*
 * a = N, b = OC: pre = x + bias (the CPU's bits), GELU(pre) against fp64; then
 * in place dinp = gelu'(pre) dout against fp64. The ends (+-30) and the middle.
 */
static int run_gelu(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->bias_gelu_fwd == NULL || be->ops->gelu_bwd == NULL) {
        return 0;
    }
    int N = r->a, OC = r->b;
    size_t n = (size_t)N * OC;
    zr_test_rng rng = {99};
    float *x = malloc(n * 4), *bias = malloc(OC * 4), *got = malloc(n * 4), *ref = malloc(n * 4);
    float *d = malloc(n * 4), *pre = malloc(n * 4);
    fill(&rng, x, n, r->amp);
    x[0] = 30.0f, x[1 % n] = -30.0f, x[2 % n] = 0.0f, x[3 % n] = 1e-4f;
    fill(&rng, bias, OC, 0.5f);
    for (int j = 0; j < 4 && j < OC; j++) {
        bias[j] = 0.0f;
    }
    fill(&rng, d, n, 1.0f);
    void *d_x = bput(be, x, n, r->t), *d_b = bput(be, bias, OC, r->t);
    void *d_out = bput(be, x, n, r->t), *d_d = bput(be, d, n, r->t);
    TEST_OK(be->ops->bias_gelu_fwd(r->t, d_out, d_x, d_b, N, OC, be->stream));
    for (size_t i = 0; i < n; i++) {
        pre[i] = x[i] + bias[i % OC];
        ref[i] = (float)gelu64(pre[i]);
    }
    bget(be, got, d_x, n, r->t);
    check("the stored pre-activation", r, got, pre, n, SAME_BITS);
    bget(be, got, d_out, n, r->t);
    check("forward", r, got, ref, n, row_tol(op, r));
    TEST_OK(be->ops->gelu_bwd(r->t, d_d, d_x, d_d, n, be->stream));
    for (size_t i = 0; i < n; i++) {
        ref[i] = (float)(dgelu64(pre[i]) * d[i]);
    }
    bget(be, got, d_d, n, r->t);
    check("backward", r, got, ref, n, 3 * row_tol(op, r));
    be->free(d_x), be->free(d_b), be->free(d_out), be->free(d_d);
    free(x), free(bias), free(got), free(ref), free(d), free(pre);
    return 1;
}

/* ---- attention ------------------------------------------------------------------------------- */

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

/*
 * a = B, b = T, c = C, d = NH: the output and log-sum-exp, dQ, dK, dV; fp32's
 * bound is the op's or 2e-7 per unit of the largest score, whichever is
 * larger (a score's rounding, 2^-23 of its size, moves its probability as
 * much); the log-sum-exp within 1e-6 of the largest (bf16: 1e-3 absolute,
 * fp32 throughout); x = 1: the backward run twice gives the same bits (no
 * atomics)
 */
static int run_attention(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->attention_fwd == NULL || be->ops->attention_bwd == NULL) {
        return 0;
    }
    int B = r->a, T = r->b, C = r->c, NH = r->d, BT = B * T;
    zr_test_rng rng = {(uint64_t)(B * 131 + T * 17 + C + NH + (int)r->amp)};
    size_t nq = (size_t)BT * 3 * C, no = (size_t)BT * C, nl = (size_t)B * NH * T;
    float *qkv = malloc(nq * 4), *dout = malloc(no * 4), *out = malloc(no * 4);
    float *lse = malloc(nl * 4), *dqkv = malloc(nq * 4), *got = malloc(nq * 4);
    float *g1 = malloc(nq * 4), *pr = malloc(no * 4), *pg = malloc(no * 4);
    fill_t(&rng, qkv, nq, r->amp, r->t);
    fill_t(&rng, dout, no, 1.0f, r->t);
    double smax = attention_ref64(qkv, dout, B, T, C, NH, out, lse, dqkv);
    int bf = r->t == ZR_DTYPE_BF16;
    double tol = bf ? row_tol(op, r) : fmax(row_tol(op, r), 2e-7 * smax);
    void *d_qkv = bput(be, qkv, nq, r->t), *d_dout = bput(be, dout, no, r->t);
    void *d_out = bput(be, out, no, r->t), *d_dqkv = bput(be, qkv, nq, r->t);
    void *d_lse = bput(be, lse, nl, ZR_DTYPE_F32), *d_delta = bput(be, lse, nl, ZR_DTYPE_F32);
    TEST_OK(be->ops->attention_fwd(r->t, d_out, d_lse, d_qkv, B, T, C, NH, be->stream));
    bget(be, got, d_out, no, r->t);
    check("out", r, got, out, no, tol);
    bget(be, got, d_lse, nl, ZR_DTYPE_F32);
    double lmax = max_abs(lse, nl);
    check("log-sum-exp", r, got, lse, nl, bf ? 1e-3 / (lmax > 0.0 ? lmax : 1.0) : 1e-6);
    TEST_OK(be->ops->attention_bwd(r->t, d_dqkv, d_delta, d_dout, d_qkv, d_out, d_lse, B, T, C, NH,
                                   be->stream));
    bget(be, got, d_dqkv, nq, r->t);
    static const char *names[3] = {"dQ", "dK", "dV"};
    for (int part = 0; part < 3; part++) {
        qkv_part(pr, dqkv, BT, C, part);
        qkv_part(pg, got, BT, C, part);
        check(names[part], r, pg, pr, no, tol);
    }
    if (r->x) {
        TEST_OK(be->ops->attention_bwd(r->t, d_dqkv, d_delta, d_dout, d_qkv, d_out, d_lse, B, T, C,
                                       NH, be->stream));
        bget(be, g1, d_dqkv, nq, r->t);
        TEST_CHECKF(memcmp(g1, got, nq * 4) == 0,
                    "attention T %d: the backward's second run differs", T);
    }
    void *ds[] = {d_qkv, d_dout, d_out, d_dqkv, d_lse, d_delta};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(got), free(g1), free(pr);
    free(pg);
    return 1;
}

/* ---- softmax + cross-entropy ----------------------------------------------------------------- */

/* The CPU's losses [N] and dlogits [N, Vp] (padding 0) of logits [N, Vp] with dloss 1/N. */
static void xent_cpu(float *losses, float *dlogits, const float *logits, const int *targets, int N,
                     int V, int Vp)
{
    memcpy(dlogits, logits, (size_t)N * Vp * 4);
    zr_op_softmax_xent_fwd(dlogits, losses, targets, N, V, Vp);
    zr_op_softmax_xent_bwd(dlogits, targets, 1.0f / (float)N, N, V, Vp);
    for (int i = 0; i < N; i++) {
        for (int j = V; j < Vp; j++) {
            dlogits[(size_t)i * Vp + j] = 0.0f;
        }
    }
}

/*
 * a = N (at most 16), b = V, c = Vp: losses within the op's bound (both
 * precisions: they are fp32), their mean within 1e-6; dlogits within (1e-6 +
 * 2^-22 amp) dloss (exp(x - lse) carries lse's rounding, 2^-24 of |lse| <=
 * amp + log V, relatively; bf16: 8e-3 dloss, one rounding of a value below
 * dloss); padded columns (12345) never read and written 0; the fused pass
 * the same bits as the two kernels, its outputs NaN-poisoned
 */
static int run_xent(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->xent_fwd == NULL || be->ops->xent_bwd == NULL || be->ops->xent_fused == NULL ||
        be->ops->mean == NULL) {
        return 0;
    }
    int N = r->a, V = r->b, Vp = r->c, targets[16];
    zr_test_rng rng = {(uint64_t)(N * V + Vp + (int)r->amp)};
    size_t n = (size_t)N * Vp;
    float *logits = malloc(n * 4), *probs = malloc(n * 4), *got = malloc(n * 4);
    float losses[16], glosses[16], glse[16], mean = 0.0f, dloss = 1.0f / (float)N;
    fill_t(&rng, logits, n, r->amp, r->t);
    for (int i = 0; i < N; i++) {
        targets[i] = (int)(zr_test_rng_next(&rng) % (uint64_t)V);
        for (int j = V; j < Vp; j++) {
            logits[(size_t)i * Vp + j] = 12345.0f;
        }
    }
    xent_cpu(losses, probs, logits, targets, N, V, Vp);
    void *d_logits = bput(be, logits, n, r->t), *d_tgt = bput_int(be, targets, N);
    void *d_losses = bpoison(be, N), *d_lse = bpoison(be, N), *d_mean = bpoison(be, 1);
    TEST_OK(be->ops->xent_fwd(r->t, d_losses, d_lse, d_logits, d_tgt, N, V, Vp, be->stream));
    TEST_OK(be->ops->mean(d_mean, d_losses, N, be->stream));
    bget(be, glosses, d_losses, N, ZR_DTYPE_F32);
    check("losses", r, glosses, losses, N, op->tol[0]);
    double sum = 0.0;
    for (int i = 0; i < N; i++) {
        sum += losses[i];
    }
    float want = (float)(sum / N);
    bget(be, &mean, d_mean, 1, ZR_DTYPE_F32);
    check("mean loss", r, &mean, &want, 1, 1e-6);
    TEST_OK(be->ops->xent_bwd(r->t, d_logits, d_lse, d_tgt, dloss, N, V, Vp, be->stream));
    bget(be, got, d_logits, n, r->t);
    double pmax = max_abs(probs, n); /* check() is relative to it (1 when it is 0) */
    check("dlogits", r, got, probs, n,
          (r->t == ZR_DTYPE_BF16 ? row_tol(op, r) : 1e-6 + 2.4e-7 * r->amp) * dloss /
              (pmax > 0.0 ? pmax : 1.0));
    float *fused = malloc(n * 4), flse[16], flosses[16];
    bget(be, glse, d_lse, N, ZR_DTYPE_F32);
    void *d_l2 = bput(be, logits, n, r->t), *d_fl = bpoison(be, N), *d_flse = bpoison(be, N);
    TEST_OK(be->ops->xent_fused(r->t, d_fl, d_flse, d_l2, d_tgt, dloss, N, V, Vp, be->stream));
    bget(be, fused, d_l2, n, r->t);
    bget(be, flosses, d_fl, N, ZR_DTYPE_F32);
    bget(be, flse, d_flse, N, ZR_DTYPE_F32);
    TEST_CHECKF(memcmp(fused, got, n * 4) == 0 && memcmp(flosses, glosses, N * 4) == 0 &&
                    memcmp(flse, glse, N * 4) == 0,
                "xent N %d V %d: the fused pass differs from the two kernels", N, V);
    void *ds[] = {d_logits, d_tgt, d_losses, d_lse, d_mean, d_l2, d_fl, d_flse};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(logits), free(probs), free(got), free(fused);
    return 1;
}
/* ---- products with epilogues ----------------------------------------------------------------- */

/*
 * a = M, b = N, c = K, d = the epilogue, x = ta * 2 + tb: C = op(A) op(B)
 * (+ bias, GELU keeping its input in aux, or times GELU'(aux)) against
 * zr_op_sgemm and the CPU's bias / GELU operators, on inputs as the storage
 * type holds them; aux has 8 spare columns (cuBLASLt wants its row stride a
 * multiple of 8), which must stay as they were
 */
static int run_gemm_epi(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->gemm_epi == NULL || be->blas_create == NULL) {
        return 0;
    }
    const int M = r->a, N = r->b, K = r->c, ta = r->x / 2, tb = r->x % 2, ldaux = N + 8;
    const int lda = ta ? M : K, ldb = tb ? K : N;
    const zr_gemm_epilogue kind = (zr_gemm_epilogue)r->d;
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N, nx = (size_t)M * ldaux;
    zr_test_rng rng = {(uint64_t)(100 + M * 7 + N * 3 + K + r->d)};
    float *A = malloc(na * 4), *B = malloc(nb * 4), *bias = malloc(N * 4), *aux = malloc(nx * 4);
    float *want = malloc(nc * 4), *got = calloc(nc, 4), *want_aux = malloc(nx * 4);
    float *pre = malloc(nc * 4);
    fill_t(&rng, A, na, 1.0f, r->t);
    fill_t(&rng, B, nb, 1.0f, r->t);
    fill_t(&rng, bias, N, 0.5f, r->t);
    fill_t(&rng, aux, nx, 2.0f, r->t);
    memcpy(want_aux, aux, nx * 4);
    zr_op_sgemm(ta, tb, M, N, K, A, lda, B, ldb, 0.0f, want, N);
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            want[(size_t)i * N + j] += kind == ZR_GEMM_EPI_BIAS ? bias[j] : 0.0f;
            pre[(size_t)i * N + j] =
                kind == ZR_GEMM_EPI_DGELU ? aux[(size_t)i * ldaux + j] : want[(size_t)i * N + j];
        }
    }
    if (kind == ZR_GEMM_EPI_BIAS_GELU) {
        zr_op_bias_gelu_fwd(want, pre, bias, M, N);
        for (int i = 0; i < M; i++) {
            memcpy(want_aux + (size_t)i * ldaux, pre + (size_t)i * N, (size_t)N * 4);
        }
    } else if (kind == ZR_GEMM_EPI_DGELU) {
        zr_op_gelu_bwd(want, NULL, pre, want, M, N);
    }
    zr_blas *h = NULL;
    TEST_OK(be->blas_create(be->stream, r->t, &h));
    void *dA = bput(be, A, na, r->t), *dB = bput(be, B, nb, r->t), *dC = bput(be, got, nc, r->t);
    void *dbias = bput(be, bias, N, r->t), *daux = bput(be, aux, nx, r->t);
    zr_gemm g = {ta, tb, M, N, K, lda, ldb, N, 0, 0, 0, 1, 1.0f, 0.0f};
    int has_bias = kind == ZR_GEMM_EPI_BIAS || kind == ZR_GEMM_EPI_BIAS_GELU;
    int has_aux = kind == ZR_GEMM_EPI_BIAS_GELU || kind == ZR_GEMM_EPI_DGELU;
    zr_gemm_epi e = {kind, has_bias ? dbias : NULL, has_aux ? daux : NULL, ldaux};
    TEST_OK(be->gemm_epi(h, &g, &e, dA, dB, dC));
    bget(be, got, dC, nc, r->t);
    check("C", r, got, want, nc, row_tol(op, r));
    float *got_aux = malloc(nx * 4);
    bget(be, got_aux, daux, nx, r->t);
    check("aux (and its spare columns)", r, got_aux, want_aux, nx, row_tol(op, r));
    be->blas_destroy(h);
    void *ds[] = {dA, dB, dC, dbias, daux};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(A), free(B), free(bias), free(aux), free(want), free(got), free(want_aux), free(pre);
    free(got_aux);
    return 1;
}

/* ---- what is not a backend-versus-CPU comparison ------------------------------------------- */

/* The host's token buckets (the embedding backward's input) exactly. */
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

#endif
