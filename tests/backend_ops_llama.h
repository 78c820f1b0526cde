/*
 * backend_ops_llama.h - the Llama family's operators in test_backend_ops'
 * table (issue 43): RMSNorm, rotary embeddings, SwiGLU and the attention
 * with grouped key and value heads, each against its CPU operator
 * (ops_llama.c, attention.c) on the same inputs, with the shapes of the
 * three test models (tests/data/hf: hidden 64; heads 8/2 of 8, 4/4 of 24,
 * 4/2 of 16; intermediate 136, 96, 176) and SmolLM2-135M's (C 576, 9 heads,
 * 3 KV heads of 64, intermediate 1536) at small B x T, and odd sizes.
 * Included once, by test_backend_ops.c, after backend_ops_model.h.
 */
#ifndef ZR_TEST_BACKEND_OPS_LLAMA_H
#define ZR_TEST_BACKEND_OPS_LLAMA_H

/* got = round(want) to bf16 in a bf16 row: what the same bits mean for a rounded output */
static void as_row_type(float *x, size_t n, zr_dtype t)
{
    if (t == ZR_DTYPE_BF16) {
        round_bf16(x, n);
    }
}

/*
 * a = N rows, b = C: the forward's out and rstd the CPU's bits, the
 * backward's dinp (accumulated onto a start) too; dw within the op's bound
 * (a column sum in another order)
 */
static int run_rmsnorm(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->rmsnorm_fwd == NULL || be->ops->rmsnorm_bwd == NULL) {
        return 0;
    }
    int N = r->a, C = r->b;
    size_t n = (size_t)N * C;
    const float eps = 1e-5f;
    zr_test_rng rng = {(uint64_t)(N * 7919 + C)};
    float *x = malloc(n * 4), *w = malloc(C * 4), *d = malloc(n * 4), *out = malloc(n * 4);
    float *dx = malloc(n * 4), *dw = malloc(C * 4), *got = malloc(n * 4), *rstd = malloc(N * 4);
    fill_t(&rng, x, n, r->amp, r->t);
    fill_t(&rng, w, C, 1.0f, r->t);
    fill_t(&rng, d, n, 1.0f, r->t);
    fill_t(&rng, dx, n, 0.5f, r->t);
    fill_t(&rng, dw, C, 0.5f, r->t);
    void *d_x = bput(be, x, n, r->t), *d_w = bput(be, w, C, r->t), *d_d = bput(be, d, n, r->t);
    void *d_dx = bput(be, dx, n, r->t), *d_dw = bput(be, dw, C, r->t);
    void *d_out = bpoison(be, n), *d_rstd = bpoison(be, N);
    void *d_scr = bpoison(be, zr_op_colsum_scratch(N, C));
    TEST_OK(be->ops->rmsnorm_fwd(r->t, d_out, d_rstd, d_x, d_w, eps, N, C, be->stream));
    zr_op_rmsnorm_fwd(out, rstd, x, w, eps, N, C);
    as_row_type(out, n, r->t);
    bget(be, got, d_out, n, r->t);
    check("out", r, got, out, n, SAME_BITS);
    bget(be, got, d_rstd, N, ZR_DTYPE_F32);
    check("rstd", r, got, rstd, N, SAME_BITS);
    TEST_OK(
        be->ops->rmsnorm_bwd(r->t, d_dx, d_dw, d_d, d_x, d_w, d_rstd, N, C, 1, d_scr, be->stream));
    zr_op_rmsnorm_bwd_acc(dx, dw, d, x, w, rstd, N, C);
    as_row_type(dx, n, r->t);
    bget(be, got, d_dx, n, r->t);
    check("dinp (accumulated)", r, got, dx, n, SAME_BITS);
    bget(be, got, d_dw, C, r->t);
    check("dw", r, got, dw, C, row_tol(op, r));
    TEST_OK(
        be->ops->rmsnorm_bwd(r->t, d_dx, d_dw, d_d, d_x, d_w, d_rstd, N, C, 0, d_scr, be->stream));
    memset(dx, 0, n * 4);
    zr_op_rmsnorm_bwd_acc(dx, dw, d, x, w, rstd, N, C);
    as_row_type(dx, n, r->t);
    bget(be, got, d_dx, n, r->t);
    check("dinp (overwritten)", r, got, dx, n, SAME_BITS);
    void *ds[] = {d_x, d_w, d_d, d_dx, d_dw, d_out, d_rstd, d_scr};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(x), free(w), free(d), free(out), free(dx), free(dw), free(got), free(rstd);
    return 1;
}

/*
 * a = B, b = T, c = NH, d = hd; x: 1 llama3 scaling (original 16 positions,
 * factor 8, low 1, high 4: every band of the frequencies), 2 in place. Both
 * directions the CPU's bits (two products and a sum per element).
 */
static int run_rope(const ops_op *op, const ops_row *r, ops_backend *be)
{
    (void)op;
    if (be->ops->rope_fwd == NULL || be->ops->rope_bwd == NULL) {
        return 0;
    }
    int B = r->a, T = r->b, NH = r->c, hd = r->d;
    size_t n = (size_t)B * T * NH * hd, nt = (size_t)T * (hd / 2);
    zr_test_rng rng = {(uint64_t)(B * 31 + T * 7 + NH * 3 + hd)};
    float *x = malloc(n * 4), *y = malloc(n * 4), *got = malloc(n * 4), *inv = malloc(hd * 2);
    float *cs = malloc(nt * 4), *sn = malloc(nt * 4);
    zr_op_rope_scaling sc = {1, 8.0, 1.0, 4.0, 16.0};
    zr_op_rope_inv_freq(inv, hd, r->x == 1 ? 500000.0 : 10000.0, r->x == 1 ? &sc : NULL);
    zr_op_rope_table(cs, sn, inv, T, hd);
    fill_t(&rng, x, n, r->amp, r->t);
    void *d_x = bput(be, x, n, r->t), *d_cs = bput(be, cs, nt, ZR_DTYPE_F32);
    void *d_sn = bput(be, sn, nt, ZR_DTYPE_F32);
    void *d_y = r->x == 2 ? d_x : bpoison(be, n);
    TEST_OK(be->ops->rope_fwd(r->t, d_y, d_x, d_cs, d_sn, B, T, NH, hd, be->stream));
    zr_op_rope_fwd(y, x, cs, sn, B, T, NH, hd);
    as_row_type(y, n, r->t);
    bget(be, got, d_y, n, r->t);
    check("forward", r, got, y, n, SAME_BITS);
    void *d_g = r->x == 2 ? d_y : bpoison(be, n);
    TEST_OK(be->ops->rope_bwd(r->t, d_g, d_y, d_cs, d_sn, B, T, NH, hd, be->stream));
    zr_op_rope_bwd(x, y, cs, sn, B, T, NH, hd);
    as_row_type(x, n, r->t);
    bget(be, got, d_g, n, r->t);
    check("backward (of the forward's output)", r, got, x, n, SAME_BITS);
    be->free(d_x), be->free(d_cs), be->free(d_sn);
    if (r->x != 2) {
        be->free(d_y), be->free(d_g);
    }
    free(x), free(y), free(got), free(inv), free(cs), free(sn);
    return 1;
}

/*
 * a = N, b = IC; x: 0 gate and up separate (ld = IC), 1 halves of one [N, 2 IC]
 * product (ld = 2 IC, the backward in place). The CPU's bits: its exp
 * polynomial, shared (llama_rules.h); amp 100 reaches the exp's clamps.
 */
static int run_swiglu(const ops_op *op, const ops_row *r, ops_backend *be)
{
    (void)op;
    if (be->ops->swiglu_fwd == NULL || be->ops->swiglu_bwd == NULL) {
        return 0;
    }
    int N = r->a, IC = r->b, ld = r->x ? 2 * IC : IC;
    size_t n = (size_t)N * IC, ni = (size_t)N * ld;
    zr_test_rng rng = {(uint64_t)(N * 17 + IC + r->x)};
    float *g = malloc(ni * 4), *u = malloc(ni * 4), *d = malloc(n * 4), *out = malloc(n * 4);
    float *dg = malloc(ni * 4), *du = malloc(ni * 4), *got = malloc(ni * 4);
    fill_t(&rng, g, ni, r->amp, r->t);
    fill_t(&rng, u, ni, 2.0f, r->t);
    fill_t(&rng, d, n, 1.0f, r->t);
    if (r->x) {
        memcpy(u, g + IC, (ni - IC) * 4); /* up = the second half of each row */
    }
    void *d_g = bput(be, g, ni, r->t), *d_d = bput(be, d, n, r->t), *d_out = bpoison(be, n);
    void *d_u = r->x ? (char *)d_g + (size_t)IC * zr_dtype_size(r->t) : bput(be, u, ni, r->t);
    TEST_OK(be->ops->swiglu_fwd(r->t, d_out, d_g, d_u, N, IC, ld, be->stream));
    zr_op_swiglu_fwd(out, g, r->x ? g + IC : u, N, IC, ld);
    as_row_type(out, n, r->t);
    bget(be, got, d_out, n, r->t);
    check("forward", r, got, out, n, SAME_BITS);
    void *d_dg = r->x ? d_g : bpoison(be, ni), *d_du = r->x ? d_u : bpoison(be, ni);
    TEST_OK(be->ops->swiglu_bwd(r->t, d_dg, d_du, d_d, d_g, d_u, N, IC, ld, be->stream));
    zr_op_swiglu_bwd(dg, r->x ? dg + IC : du, d, g, r->x ? g + IC : u, N, IC, ld);
    float *gu = malloc(ni * 4), *want = malloc(n * 4), *have = malloc(n * 4);
    bget(be, got, d_dg, ni, r->t); /* with x: the whole [N, 2 IC] */
    if (!r->x) {
        bget(be, gu, d_du, ni, r->t);
    }
    const float *hv[2] = {got, r->x ? got + IC : gu}, *wv[2] = {dg, r->x ? dg + IC : du};
    for (int part = 0; part < 2; part++) {
        for (int i = 0; i < N; i++) {
            memcpy(want + (size_t)i * IC, wv[part] + (size_t)i * ld, IC * 4);
            memcpy(have + (size_t)i * IC, hv[part] + (size_t)i * ld, IC * 4);
        }
        as_row_type(want, n, r->t);
        check(part ? "dup" : "dgate", r, have, want, n, SAME_BITS);
    }
    void *ds[] = {d_g, d_d, d_out};
    bfree_n(be, ds, 3);
    if (!r->x) {
        be->free(d_u), be->free(d_dg), be->free(d_du);
    }
    free(g), free(u), free(d), free(out), free(dg), free(du), free(got), free(gu), free(want);
    free(have);
    return 1;
}

/*
 * check() with the bound relative to the largest |want| or 1, whichever is larger: inputs
 * and dout are within 1, and where the gradients vanish (T = 1: dq, dk are 0 but for
 * rounding) the CPU's rounding is no scale.
 */
static void check_floor1(const char *what, const ops_row *r, const float *got, const float *want,
                         size_t n, double tol)
{
    double m = max_abs(want, n);
    check(what, r, got, want, n, m < 1.0 && m > 0.0 ? tol / m : tol);
}

/*
 * NKV = NH: GPT-2's attention (attention_*_variant) on the same q, k, v cut into one qkv gives
 * the grouped one's bits (g: its device out, lse, dq, dk, dv, in this order): one layout.
 */
static void gqa_as_mha(ops_backend *be, const ops_row *r, int variant, const float *q,
                       const float *k, const float *v, const float *dout, void *const *g)
{
    int B = r->a, T = r->b, NH = r->c, C = NH * r->x, BT = B * T;
    size_t no = (size_t)BT * C, nl = (size_t)B * NH * T;
    float *qkv = malloc(3 * no * 4), *h1 = malloc(3 * no * 4), *h2 = malloc(3 * no * 4);
    for (int i = 0; i < BT; i++) {
        const float *src[3] = {q, k, v};
        for (int part = 0; part < 3; part++) {
            memcpy(qkv + ((size_t)i * 3 + part) * C, src[part] + (size_t)i * C, C * 4);
        }
    }
    void *d_qkv = bput(be, qkv, 3 * no, r->t), *d_do = bput(be, dout, no, r->t);
    void *d_out = bpoison(be, no), *d_lse = bpoison(be, nl), *d_dqkv = bpoison(be, 3 * no);
    void *d_dl = bpoison(be, nl);
    TEST_OK(be->ops->attention_fwd_variant(variant, r->t, d_out, d_lse, d_qkv, B, T, C, NH,
                                           be->stream));
    TEST_OK(be->ops->attention_bwd_variant(variant, 0, r->t, d_dqkv, d_dl, d_do, d_qkv, d_out,
                                           d_lse, B, T, C, NH, be->stream));
    bget(be, h1, d_out, no, r->t), bget(be, h2, g[0], no, r->t);
    check("out as GPT-2's", r, h1, h2, no, SAME_BITS);
    bget(be, h1, d_lse, nl, ZR_DTYPE_F32), bget(be, h2, g[1], nl, ZR_DTYPE_F32);
    check("lse as GPT-2's", r, h1, h2, nl, SAME_BITS);
    bget(be, h1, d_dqkv, 3 * no, r->t);
    for (int part = 0; part < 3; part++) {
        bget(be, h2, g[2 + part], no, r->t);
        qkv_part(qkv, h1, BT, C, part);
        check("dq, dk, dv as GPT-2's", r, qkv, h2, no, SAME_BITS);
    }
    void *ds[] = {d_qkv, d_do, d_out, d_lse, d_dqkv, d_dl};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(qkv), free(h1), free(h2);
}

/*
 * a = B, b = T, c = NH, d = NKV, x = hd: out, lse, dq, dk, dv against the
 * CPU's zr_op_attention_gqa_fwd / _bwd on the same inputs, for every kernel
 * that applies (the scalar ones, variant -1, always; the tensor-core ones,
 * every variant, where attention_tensor_cores says so); the backward run twice, the same bits; with
 * NKV = NH the bits of GPT-2's attention on the same tensors
 */
static int run_gqa(const ops_op *op, const ops_row *r, ops_backend *be)
{
    if (be->ops->attention_gqa_fwd == NULL || be->ops->attention_gqa_bwd == NULL) {
        return 0;
    }
    int B = r->a, T = r->b, NH = r->c, NKV = r->d, hd = r->x;
    size_t nq = (size_t)B * T * NH * hd, nk = (size_t)B * T * NKV * hd, nl = (size_t)B * NH * T;
    zr_test_rng rng = {(uint64_t)(B * 131 + T * 17 + NH * 5 + NKV + hd)};
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *out = malloc(nq * 4), *lse = malloc(nl * 4), *dq = malloc(nq * 4);
    float *dk = malloc(nk * 4), *dv = malloc(nk * 4), *scr = malloc(nl * 4);
    float *got = malloc(nq * 4), *again = malloc(nq * 4);
    fill_t(&rng, q, nq, r->amp, r->t);
    fill_t(&rng, k, nk, r->amp, r->t);
    fill_t(&rng, v, nk, 1.0f, r->t);
    fill_t(&rng, dout, nq, 1.0f, r->t);
    zr_op_attention_gqa_fwd(out, lse, q, k, v, B, T, NH, NKV, hd);
    zr_op_attention_gqa_bwd(dq, dk, dv, scr, dout, q, k, v, out, lse, B, T, NH, NKV, hd);
    int bf = r->t == ZR_DTYPE_BF16, tc = be->ops->attention_tensor_cores(r->t, hd, NH / NKV);
    double tol = row_tol(op, r), lmax = max_abs(lse, nl);
    void *d_q = bput(be, q, nq, r->t), *d_k = bput(be, k, nk, r->t), *d_v = bput(be, v, nk, r->t);
    void *d_do = bput(be, dout, nq, r->t), *d_out = bpoison(be, nq), *d_lse = bpoison(be, nl);
    void *d_dq = bpoison(be, nq), *d_dk = bpoison(be, nk), *d_dv = bpoison(be, nk);
    void *d_dl = bpoison(be, nl);
    for (int variant = -1; variant < (tc ? ZR_OP_CUDA_ATT_VARIANTS : 0); variant++) {
        TEST_OK(be->ops->attention_gqa_fwd(variant, r->t, d_out, d_lse, d_q, d_k, d_v, B, T, NH,
                                           NKV, hd, be->stream));
        bget(be, got, d_out, nq, r->t);
        check(variant < 0 ? "out (scalar kernels)" : "out (tensor cores, a variant)", r, got, out,
              nq, tol);
        bget(be, got, d_lse, nl, ZR_DTYPE_F32);
        check("log-sum-exp", r, got, lse, nl, bf ? 1e-3 / (lmax > 0.0 ? lmax : 1.0) : 1e-6);
        for (int rep = 0; rep < 2; rep++) { /* the second run: the first's dk bits */
            TEST_OK(be->ops->attention_gqa_bwd(variant, r->t, d_dq, d_dk, d_dv, d_dl, d_do, d_q,
                                               d_k, d_v, d_out, d_lse, B, T, NH, NKV, hd,
                                               be->stream));
            bget(be, rep ? got : again, d_dk, nk, r->t);
        }
        TEST_CHECKF(memcmp(again, got, nk * 4) == 0, "gqa T %d: the backward's second dk differs",
                    T);
        check_floor1("dk", r, got, dk, nk, tol);
        bget(be, got, d_dq, nq, r->t);
        check_floor1("dq", r, got, dq, nq, tol);
        bget(be, got, d_dv, nk, r->t);
        check_floor1("dv", r, got, dv, nk, tol);
        if (NKV == NH) {
            void *g[] = {d_out, d_lse, d_dq, d_dk, d_dv};
            gqa_as_mha(be, r, variant, q, k, v, dout, g);
        }
    }
    void *ds[] = {d_q, d_k, d_v, d_do, d_out, d_lse, d_dq, d_dk, d_dv, d_dl};
    bfree_n(be, ds, sizeof ds / sizeof ds[0]);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    free(scr), free(got), free(again);
    return 1;
}

static const ops_op OP_RMSNORM = {
    "rmsnorm",
    "zr_op_rmsnorm_fwd, zr_op_rmsnorm_bwd_acc",
    {2e-6, 8e-3},
    "out, rstd, dinp: the CPU's bits (its 16-lane sums, llama_rules.h); dw: a column sum in "
    "another order (seen: 2e-7), bf16 plus one rounding",
    run_rmsnorm};
static const ops_op OP_ROPE = {"rope",
                               "zr_op_rope_fwd, zr_op_rope_bwd",
                               {SAME_BITS, SAME_BITS},
                               "two products and a sum per element: the same bits",
                               run_rope};
static const ops_op OP_SWIGLU = {
    "swiglu",
    "zr_op_swiglu_fwd, zr_op_swiglu_bwd",
    {SAME_BITS, SAME_BITS},
    "the CPU's exp polynomial and order (llama_rules.h): the same bits",
    run_swiglu};
static const ops_op OP_GQA = {
    "attention_gqa",
    "zr_op_attention_gqa_fwd, zr_op_attention_gqa_bwd",
    {2e-6, 1e-2},
    "fp32: sums in another order (dk, dv over the group's heads; seen: 1.2e-7); bf16: the "
    "outputs rounded, the tensor cores' probabilities in bf16 (seen: 2.6e-3)",
    run_gqa};

/* shapes: a, b, c, d as each op names them; amp; storage type; x (the op's own) */
static const ops_row llama_rows[] = {
    {&OP_RMSNORM, 7, 64, 0, 0, 2, ZR_DTYPE_F32, 0}, /* the test models' hidden size */
    {&OP_RMSNORM, 7, 64, 0, 0, 2, ZR_DTYPE_BF16, 0},
    {&OP_RMSNORM, 6, 576, 0, 0, 2, ZR_DTYPE_F32, 0}, /* SmolLM2-135M's */
    {&OP_RMSNORM, 6, 576, 0, 0, 2, ZR_DTYPE_BF16, 0},
    {&OP_RMSNORM, 37, 264, 0, 0, 2, ZR_DTYPE_F32, 0}, /* two column blocks of dw */
    {&OP_RMSNORM, 9, 37, 0, 0, 2, ZR_DTYPE_F32, 0},   /* odd: 16 lanes, a short tail */
    {&OP_RMSNORM, 1, 1, 0, 0, 2, ZR_DTYPE_F32, 0},    /* one element */
    {&OP_RMSNORM, 3, 1030, 0, 0, 2, ZR_DTYPE_BF16, 0},
    {&OP_ROPE, 2, 5, 8, 8, 1, ZR_DTYPE_F32, 0},  /* llama_gqa's q: 8 heads of 8 */
    {&OP_ROPE, 2, 5, 4, 24, 1, ZR_DTYPE_F32, 1}, /* llama_mha_tied's, llama3 scaling */
    {&OP_ROPE, 1, 7, 2, 16, 1, ZR_DTYPE_F32, 2}, /* qwen2's k, in place */
    {&OP_ROPE, 2, 3, 9, 64, 1, ZR_DTYPE_F32, 1}, /* SmolLM2's q */
    {&OP_ROPE, 2, 3, 3, 64, 1, ZR_DTYPE_BF16, 0},
    {&OP_ROPE, 1, 9, 3, 2, 1, ZR_DTYPE_BF16, 2},
    {&OP_ROPE, 1, 1, 1, 6, 1, ZR_DTYPE_F32, 0},      /* T = 1, odd pairs */
    {&OP_SWIGLU, 7, 136, 0, 0, 4, ZR_DTYPE_F32, 0},  /* llama_gqa's intermediate */
    {&OP_SWIGLU, 5, 96, 0, 0, 4, ZR_DTYPE_F32, 1},   /* llama_mha_tied's, one product */
    {&OP_SWIGLU, 3, 176, 0, 0, 4, ZR_DTYPE_BF16, 0}, /* qwen2's */
    {&OP_SWIGLU, 3, 1536, 0, 0, 8, ZR_DTYPE_F32, 1}, /* SmolLM2's */
    {&OP_SWIGLU, 2, 1536, 0, 0, 8, ZR_DTYPE_BF16, 1},
    {&OP_SWIGLU, 5, 13, 0, 0, 100, ZR_DTYPE_F32, 0}, /* the exp's clamps */
    {&OP_SWIGLU, 1, 1, 0, 0, 4, ZR_DTYPE_F32, 1},
    /* a = B, b = T, c = NH, d = NKV, x = hd */
    {&OP_GQA, 2, 9, 8, 2, 1, ZR_DTYPE_F32, 8},     /* llama_gqa: GQA 4:1, hd 8 */
    {&OP_GQA, 1, 33, 8, 2, 1, ZR_DTYPE_BF16, 8},   /* two key tiles */
    {&OP_GQA, 2, 9, 4, 4, 1, ZR_DTYPE_F32, 24},    /* llama_mha_tied: MHA, hd 24 */
    {&OP_GQA, 1, 20, 4, 4, 1, ZR_DTYPE_BF16, 24},  /* no tensor cores at 24 */
    {&OP_GQA, 2, 11, 4, 2, 1, ZR_DTYPE_F32, 16},   /* qwen2: 2:1, hd 16 */
    {&OP_GQA, 1, 17, 4, 1, 1, ZR_DTYPE_F32, 16},   /* MQA */
    {&OP_GQA, 1, 13, 9, 3, 1, ZR_DTYPE_F32, 64},   /* SmolLM2-135M: 9 heads, 3 KV heads */
    {&OP_GQA, 2, 70, 9, 3, 1, ZR_DTYPE_BF16, 64},  /* tensor cores, two blocks, a short one */
    {&OP_GQA, 1, 65, 4, 1, 1, ZR_DTYPE_BF16, 32},  /* MQA on tensor cores */
    {&OP_GQA, 1, 70, 2, 2, 1, ZR_DTYPE_BF16, 64},  /* MHA on tensor cores: GPT-2's bits */
    {&OP_GQA, 1, 257, 4, 2, 1, ZR_DTYPE_BF16, 64}, /* five query and key blocks, one of 1 */
    {&OP_GQA, 1, 40, 4, 2, 1, ZR_DTYPE_BF16, 128}, /* 128 grouped: the scalar kernels */
    {&OP_GQA, 1, 1, 6, 3, 1, ZR_DTYPE_F32, 40},    /* T = 1 */
};

#endif /* ZR_TEST_BACKEND_OPS_LLAMA_H */
