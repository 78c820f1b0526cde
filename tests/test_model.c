/*
 * test_model.c - GPT-2 on the CPU: parameter layout, initialisation,
 * finite-difference gradients of every tensor, call-order errors,
 * determinism, independence from where unit buffers live, from the thread
 * count and from the vector width, the streamed attention against a
 * double-precision reference, activation memory linear in T, and a loss
 * that falls when one batch is trained on repeatedly.
 */
#define _DEFAULT_SOURCE /* setenv */
#include "test.h"
#include "zr/model.h"
#include "zr/optim.h"
#include "zr/pool.h"

#include "../src/model/ops.h" /* zr_op_exp, attention, kernel choice: internal to src/model */

/* All units of one model, each in its own allocation unless told otherwise. */
typedef struct units {
    int n;
    float *p[64], *g[64];
    float *block; /* non-NULL: every unit is a slice of this one buffer */
} units;

static void units_alloc(units *us, const zr_gpt *m, size_t misalign)
{
    memset(us, 0, sizeof *us);
    us->n = zr_gpt_unit_count(m);
    TEST_CHECK(us->n <= 64);
    if (misalign > 0) {
        size_t total = 0;
        for (int u = 0; u < us->n; u++) {
            total += zr_gpt_unit_numel(m, u) + misalign;
        }
        TEST_OK(zr_alloc_at((void **)&us->block, 2 * total * sizeof(float), __FILE__, __LINE__));
        size_t off = misalign;
        for (int u = 0; u < us->n; u++) {
            us->p[u] = us->block + off;
            off += zr_gpt_unit_numel(m, u) + misalign;
        }
        for (int u = 0; u < us->n; u++) {
            us->g[u] = us->block + off;
            off += zr_gpt_unit_numel(m, u) + misalign;
        }
        return;
    }
    for (int u = 0; u < us->n; u++) {
        TEST_OK(zr_alloc_at((void **)&us->p[u], zr_gpt_unit_numel(m, u) * sizeof(float), __FILE__,
                            __LINE__));
        TEST_OK(zr_alloc_at((void **)&us->g[u], zr_gpt_unit_numel(m, u) * sizeof(float), __FILE__,
                            __LINE__));
    }
}

static void units_free(units *us)
{
    if (us->block != NULL) {
        zr_free(us->block);
    } else {
        for (int u = 0; u < us->n; u++) {
            zr_free(us->p[u]);
            zr_free(us->g[u]);
        }
    }
    memset(us, 0, sizeof *us);
}

static void units_zero_grad(units *us, const zr_gpt *m)
{
    for (int u = 0; u < us->n; u++) {
        memset(us->g[u], 0, zr_gpt_unit_numel(m, u) * sizeof(float));
    }
}

static float forward(zr_gpt *m, units *us, const int *in, const int *tg)
{
    TEST_OK(zr_gpt_forward_begin(m, in, tg));
    for (int u = 0; u < us->n; u++) {
        TEST_OK(zr_gpt_forward_unit(m, u, us->p[u], us->p[0]));
    }
    return zr_gpt_loss(m);
}

static float forward_backward(zr_gpt *m, units *us, const int *in, const int *tg)
{
    float loss = forward(m, us, in, tg);
    TEST_OK(zr_gpt_backward_begin(m));
    for (int u = us->n - 1; u >= 0; u--) {
        TEST_OK(zr_gpt_backward_unit(m, u, us->p[u], us->p[0], us->g[u], us->g[0]));
    }
    return loss;
}

/* Random parameters, larger than GPT-2's init so that every path carries a
 * gradient well above fp32 noise. Padded wte rows stay 0. */
static void random_params(const zr_gpt *m, units *us, uint64_t seed)
{
    zr_test_rng r = {seed};
    for (int u = 0; u < us->n; u++) {
        const zr_tensor_desc *d;
        int nt = zr_gpt_unit_tensors(m, u, &d);
        for (int i = 0; i < nt; i++) {
            float *p = us->p[u] + d[i].offset;
            size_t numel = d[i].numel;
            if (u == 0 && i == 0) {
                numel = (size_t)m->cfg.vocab * m->cfg.channels;
            }
            const char *nm = d[i].name;
            int is_lnw = d[i].ndim == 1 && nm[strlen(nm) - 1] == 'w';
            for (size_t j = 0; j < numel; j++) {
                float z = zr_test_rng_normal(&r);
                p[j] = is_lnw ? 1.0f + 0.2f * z : (d[i].ndim == 2 ? 0.3f : 0.1f) * z;
            }
        }
    }
}

static void random_tokens(int *x, int n, int V, uint64_t seed)
{
    zr_test_rng r = {seed};
    for (int i = 0; i < n; i++) {
        x[i] = (int)(zr_test_rng_next(&r) % (uint64_t)V);
    }
}

/* ---- layout and init ------------------------------------------------------ */

static void test_layout(void)
{
    /* GPT-2 124M with llm.c's padded vocabulary: llm.c reports 124475904 */
    zr_gpt_config c124 = {1024, 50257, 50304, 12, 12, 768};
    TEST_OK(zr_gpt_config_check(&c124));
    TEST_EQ_INT(zr_gpt_config_param_count(&c124), 124475904);
    TEST_EQ_INT(zr_gpt_config_unit_count(&c124), 14);

    zr_gpt_config cfg = {8, 30, 32, 2, 2, 16};
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, &cfg, 2, 8));
    TEST_EQ_INT(zr_gpt_unit_count(&m), 4);
    for (int u = 0; u < 4; u++) {
        const zr_tensor_desc *d;
        int nt = zr_gpt_unit_tensors(&m, u, &d);
        size_t off = 0;
        for (int i = 0; i < nt; i++) {
            TEST_EQ_INT(d[i].offset, off); /* contiguous, no overlap, no gap */
            size_t prod = 1;
            for (int k = 0; k < d[i].ndim; k++) {
                prod *= (size_t)d[i].shape[k];
            }
            TEST_EQ_INT(prod, d[i].numel);
            TEST_EQ_INT(d[i].decay, d[i].ndim == 2);
            off += d[i].numel;
        }
        TEST_EQ_INT(off, zr_gpt_unit_numel(&m, u));
    }
    TEST_EQ_INT(zr_gpt_unit_numel(&m, 1), 12 * 16 * 16 + 13 * 16);
    zr_gpt_free(&m);

    zr_gpt_config bad = cfg;
    bad.channels = 15;
    TEST_FAILS(zr_gpt_init(&m, &bad, 2, 8), ZR_ERR_INVALID, "not a multiple of heads");
    bad = cfg;
    bad.padded_vocab = 20;
    TEST_FAILS(zr_gpt_config_check(&bad), ZR_ERR_INVALID, "padded_vocab");
    TEST_FAILS(zr_gpt_init(&m, &cfg, 2, 9), ZR_ERR_INVALID, "max_t");
    zr_gpt_free(&m); /* safe after a failed init */
}

static void test_init(void)
{
    zr_gpt_config cfg = {64, 250, 256, 4, 4, 64};
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, &cfg, 1, 4));
    units a, b;
    units_alloc(&a, &m, 0);
    units_alloc(&b, &m, 0);
    /* initialise in a different order: results depend on (seed, u) only */
    for (int u = 0; u < a.n; u++) {
        zr_gpt_unit_init_params(&m, u, a.p[u], 42);
    }
    for (int u = b.n - 1; u >= 0; u--) {
        zr_gpt_unit_init_params(&m, u, b.p[u], 42);
    }
    for (int u = 0; u < a.n; u++) {
        TEST_CHECK(memcmp(a.p[u], b.p[u], zr_gpt_unit_numel(&m, u) * sizeof(float)) == 0);
    }
    zr_gpt_unit_init_params(&m, 1, b.p[1], 43);
    TEST_CHECK(memcmp(a.p[1], b.p[1], zr_gpt_unit_numel(&m, 1) * sizeof(float)) != 0);
    /* block units differ from each other (not one stream reused) */
    TEST_CHECK(memcmp(a.p[1], a.p[2], zr_gpt_unit_numel(&m, 1) * sizeof(float)) != 0);

    for (int u = 0; u < a.n; u++) {
        const zr_tensor_desc *d;
        int nt = zr_gpt_unit_tensors(&m, u, &d);
        for (int i = 0; i < nt; i++) {
            const float *p = a.p[u] + d[i].offset;
            const char *nm = d[i].name;
            if (d[i].ndim == 1) {
                float want = nm[strlen(nm) - 1] == 'w' ? 1.0f : 0.0f;
                int ok = 1;
                for (size_t j = 0; j < d[i].numel; j++) {
                    ok &= p[j] == want;
                }
                TEST_CHECKF(ok, "unit %d %s is not all %g", u, nm, want);
                continue;
            }
            size_t n = d[i].numel;
            if (u == 0 && i == 0) {
                n = (size_t)cfg.vocab * cfg.channels;
                int zero = 1;
                for (size_t j = n; j < d[i].numel; j++) {
                    zero &= p[j] == 0.0f;
                }
                TEST_CHECKF(zero, "padded wte rows are not zero");
            }
            double s = 0, s2 = 0;
            for (size_t j = 0; j < n; j++) {
                s += p[j];
                s2 += (double)p[j] * p[j];
            }
            double std = sqrt(s2 / n - (s / n) * (s / n));
            int proj = strcmp(nm, "attprojw") == 0 || strcmp(nm, "fcprojw") == 0;
            double want = proj ? 0.02 / sqrt(2.0 * cfg.layers) : 0.02;
            TEST_CHECKF(fabs(std - want) < 0.1 * want, "unit %d %s: std %g, want %g", u, nm, std,
                        want);
            TEST_CHECKF(fabs(s / n) < 0.1 * want, "unit %d %s: mean %g", u, nm, s / n);
        }
    }
    units_free(&a);
    units_free(&b);
    zr_gpt_free(&m);
}

/* ---- gradient check --------------------------------------------------------- */

/*
 * Central differences in fp32 with h = 1e-2 on parameters of size ~0.3:
 * truncation error O(h^2) and rounding noise ~1e-7 / h are both around 1e-5
 * absolute, against gradients of 1e-3 .. 1e-1. Per tensor the relative error
 * ||fd - g|| / max(||fd||, ||g||) over the sampled elements must be below
 * ZR_GRAD_TOL = 5e-3; measured values are ~1e-4 .. 2e-3, while a wrong sign,
 * factor, transpose or missing term gives 0.1 .. 2.
 */
#define ZR_GRAD_TOL 5e-3

static void gradcheck(const zr_gpt_config *cfg, int B, int T, int samples, uint64_t seed)
{
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, cfg, B, T));
    units us;
    units_alloc(&us, &m, 0);
    random_params(&m, &us, seed);
    int BT = B * T;
    int *in = calloc((size_t)BT, sizeof *in), *tg = calloc((size_t)BT, sizeof *tg);
    TEST_CHECK(in != NULL && tg != NULL);
    random_tokens(in, BT, cfg->vocab, seed + 1);
    random_tokens(tg, BT, cfg->vocab, seed + 2);
    units_zero_grad(&us, &m);
    forward_backward(&m, &us, in, tg);

    const float h = 1e-2f;
    zr_test_rng r = {seed + 3};
    double worst = 0;
    for (int u = 0; u < us.n; u++) {
        const zr_tensor_desc *d;
        int nt = zr_gpt_unit_tensors(&m, u, &d);
        for (int i = 0; i < nt; i++) {
            size_t numel = d[i].numel;
            if (u == 0 && i == 0) {
                numel = (size_t)cfg->vocab * cfg->channels;
            }
            double e2 = 0, f2 = 0, g2 = 0;
            int count = (size_t)samples < numel ? samples : (int)numel;
            for (int s = 0; s < count; s++) {
                size_t j = (size_t)samples < numel ? zr_test_rng_next(&r) % numel : (size_t)s;
                float *p = us.p[u] + d[i].offset + j;
                float g = us.g[u][d[i].offset + j];
                float keep = *p;
                *p = keep + h;
                double lp = forward(&m, &us, in, tg);
                *p = keep - h;
                double lm = forward(&m, &us, in, tg);
                *p = keep;
                double fd = (lp - lm) / (2.0 * h);
                e2 += (fd - g) * (fd - g);
                f2 += fd * fd;
                g2 += (double)g * g;
            }
            double rel = sqrt(e2) / fmax(sqrt(fmax(f2, g2)), 1e-12);
            worst = fmax(worst, rel);
            TEST_CHECKF(rel < ZR_GRAD_TOL, "unit %d %s: relative error %.3g (|g| %.3g, |fd| %.3g)",
                        u, d[i].name, rel, sqrt(g2), sqrt(f2));
            TEST_CHECKF(g2 > 1e-12, "unit %d %s: gradient is zero", u, d[i].name);
        }
    }
    printf("  gradcheck L=%d C=%d T=%d: worst relative error %.3g (tolerance %.0e)\n", cfg->layers,
           cfg->channels, T, worst, ZR_GRAD_TOL);
    free(in);
    free(tg);
    units_free(&us);
    zr_gpt_free(&m);
}

static void test_gradcheck_small(void)
{
    /* V = 30 padded to 32: the padded logits must stay out of the softmax */
    zr_gpt_config cfg = {8, 30, 32, 2, 2, 16};
    gradcheck(&cfg, 2, 8, 48, 7);
}

static void test_gradcheck_long(void)
{
    /* T > one attention row block (128): checks the causal block split */
    zr_gpt_config cfg = {160, 16, 16, 1, 2, 8};
    gradcheck(&cfg, 1, 150, 24, 11);
}

/* ---- behaviour -------------------------------------------------------------- */

static void test_order_and_tokens(void)
{
    zr_gpt_config cfg = {8, 30, 32, 2, 2, 16};
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, &cfg, 1, 8));
    units us;
    units_alloc(&us, &m, 0);
    for (int u = 0; u < us.n; u++) {
        zr_gpt_unit_init_params(&m, u, us.p[u], 1);
    }
    int in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    TEST_FAILS(zr_gpt_forward_unit(&m, 0, us.p[0], us.p[0]), ZR_ERR_INVALID, "expected");
    TEST_OK(zr_gpt_forward_begin(&m, in, tg));
    TEST_FAILS(zr_gpt_forward_unit(&m, 1, us.p[1], us.p[0]), ZR_ERR_INVALID, "expected 0");
    TEST_FAILS(zr_gpt_backward_begin(&m), ZR_ERR_INVALID, "complete forward");
    for (int u = 0; u < us.n; u++) {
        TEST_OK(zr_gpt_forward_unit(&m, u, us.p[u], us.p[0]));
    }
    TEST_CHECK(isfinite(zr_gpt_loss(&m)));
    /* probabilities: each row sums to 1, padded columns are 0 */
    const float *pr = zr_gpt_probs(&m);
    double s = 0;
    for (int j = 0; j < 32; j++) {
        s += pr[j];
    }
    TEST_NEAR(s, 1.0, 1e-5);
    TEST_CHECK(pr[30] == 0.0f && pr[31] == 0.0f);
    TEST_OK(zr_gpt_backward_begin(&m));
    TEST_FAILS(zr_gpt_backward_unit(&m, 0, us.p[0], us.p[0], us.g[0], us.g[0]), ZR_ERR_INVALID,
               "expected 3");
    TEST_FAILS(zr_gpt_backward_unit(&m, 3, us.p[3], us.p[0], us.g[3], NULL), ZR_ERR_INVALID,
               "unit 0");
    in[3] = 30;
    TEST_FAILS(zr_gpt_forward_begin(&m, in, tg), ZR_ERR_INVALID, "input token 30");
    in[3] = 4;
    tg[5] = -1;
    TEST_FAILS(zr_gpt_forward_begin(&m, in, tg), ZR_ERR_INVALID, "target token -1");
    /* without targets: no loss, no backward */
    TEST_OK(zr_gpt_forward_begin(&m, in, NULL));
    for (int u = 0; u < us.n; u++) {
        TEST_OK(zr_gpt_forward_unit(&m, u, us.p[u], us.p[0]));
    }
    TEST_CHECK(isnan(zr_gpt_loss(&m)));
    TEST_FAILS(zr_gpt_backward_begin(&m), ZR_ERR_INVALID, "targets");
    units_free(&us);
    zr_gpt_free(&m);
}

/* One run: loss and all gradients, from parameters in the given buffers. */
static float run_once(const zr_gpt_config *cfg, units *us, zr_gpt *m, const int *in, const int *tg)
{
    for (int u = 0; u < us->n; u++) {
        zr_gpt_unit_init_params(m, u, us->p[u], 5);
    }
    units_zero_grad(us, m);
    (void)cfg;
    return forward_backward(m, us, in, tg);
}

static int units_equal(const zr_gpt *m, const units *a, const units *b)
{
    int same = 1;
    for (int u = 0; u < a->n; u++) {
        size_t n = zr_gpt_unit_numel(m, u) * sizeof(float);
        same &= memcmp(a->p[u], b->p[u], n) == 0 && memcmp(a->g[u], b->g[u], n) == 0;
    }
    return same;
}

static void test_determinism_and_buffers(void)
{
    zr_gpt_config cfg = {64, 60, 64, 2, 4, 32};
    int B = 2, T = 48;
    zr_gpt m1, m2;
    TEST_OK(zr_gpt_init(&m1, &cfg, B, T));
    TEST_OK(zr_gpt_init(&m2, &cfg, B, T));
    int in[96], tg[96];
    random_tokens(in, B * T, cfg.vocab, 3);
    random_tokens(tg, B * T, cfg.vocab, 4);
    units a, b, c;
    units_alloc(&a, &m1, 0);
    units_alloc(&b, &m1, 0);
    units_alloc(&c, &m1, 3); /* one block, every unit misaligned by 3 floats */
    float la = run_once(&cfg, &a, &m1, in, tg);
    float lb = run_once(&cfg, &b, &m1, in, tg); /* same model struct, second run */
    float lc = run_once(&cfg, &c, &m2, in, tg); /* other struct, other buffers */
    TEST_CHECKF(memcmp(&la, &lb, sizeof la) == 0 && memcmp(&la, &lc, sizeof la) == 0,
                "losses differ: %.9g %.9g %.9g", la, lb, lc);
    TEST_CHECK(units_equal(&m1, &a, &b));
    TEST_CHECK(units_equal(&m1, &a, &c));

    /* gradients accumulate: a second backward adds the same amount again */
    forward_backward(&m1, &a, in, tg);
    double err = 0, ref = 0;
    for (int u = 0; u < a.n; u++) {
        for (size_t j = 0; j < zr_gpt_unit_numel(&m1, u); j++) {
            err = fmax(err, fabs(a.g[u][j] - 2.0f * b.g[u][j]));
            ref = fmax(ref, fabs(b.g[u][j]));
        }
    }
    TEST_CHECKF(err <= 1e-5 * ref, "accumulated gradient off by %g (max |g| %g)", err, ref);
    units_free(&a);
    units_free(&b);
    units_free(&c);
    zr_gpt_free(&m1);
    zr_gpt_free(&m2);
}

static void test_loss_falls(void)
{
    /* memorise one batch: the loss must drop from ~log(V) far below it */
    zr_gpt_config cfg = {32, 64, 64, 2, 2, 32};
    int B = 2, T = 32;
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, &cfg, B, T));
    units us, mom, var;
    units_alloc(&us, &m, 0);
    units_alloc(&mom, &m, 0);
    units_alloc(&var, &m, 0);
    for (int u = 0; u < us.n; u++) {
        zr_gpt_unit_init_params(&m, u, us.p[u], 9);
    }
    int in[64], tg[64];
    random_tokens(in, B * T, cfg.vocab, 12);
    for (int i = 0; i < B * T; i++) {
        tg[i] = (in[i] * 7 + 3) % cfg.vocab; /* a learnable map */
    }
    zr_adamw h = zr_adamw_default();
    float first = 0, loss = 0;
    for (int step = 1; step <= 80; step++) {
        units_zero_grad(&us, &m);
        loss = forward_backward(&m, &us, in, tg);
        if (step == 1) {
            first = loss;
        }
        for (int u = 0; u < us.n; u++) {
            const zr_tensor_desc *d;
            int nt = zr_gpt_unit_tensors(&m, u, &d);
            for (int i = 0; i < nt; i++) {
                size_t o = d[i].offset;
                zr_adamw_update(&h, 3e-3f, step, 1.0f, d[i].decay, us.p[u] + o, us.g[u] + o,
                                mom.p[u] + o, var.p[u] + o, d[i].numel);
            }
        }
    }
    printf("  loss %.4f -> %.4f after 80 steps\n", first, loss);
    TEST_NEAR(first, log(64.0), 0.2);
    TEST_CHECKF(loss < 0.3f, "loss %.4f did not fall below 0.3", loss);
    units_free(&us);
    units_free(&mom);
    units_free(&var);
    zr_gpt_free(&m);
}

/* ---- threads, vector width, attention accuracy, memory ---------------------- */

/*
 * One training step (forward, backward, AdamW on every tensor) from the same
 * parameters, returning the loss; parameters, gradients and moments end up
 * in us, mom and var.
 */
static float train_step(zr_gpt *m, units *us, units *mom, units *var, const int *in, const int *tg)
{
    for (int u = 0; u < us->n; u++) {
        zr_gpt_unit_init_params(m, u, us->p[u], 21);
        memset(mom->p[u], 0, zr_gpt_unit_numel(m, u) * sizeof(float));
        memset(var->p[u], 0, zr_gpt_unit_numel(m, u) * sizeof(float));
    }
    units_zero_grad(us, m);
    float loss = forward_backward(m, us, in, tg);
    zr_adamw h = zr_adamw_default();
    for (int u = 0; u < us->n; u++) {
        zr_adamw_update(&h, 1e-3f, 1, 1.0f, 1, us->p[u], us->g[u], mom->p[u], var->p[u],
                        zr_gpt_unit_numel(m, u));
    }
    return loss;
}

/*
 * Same bits at 1, 2 and 3 threads, and with the reference kernels forced:
 * the shapes are large enough that every operator splits its rows or
 * columns over the threads (at least two of the pool's grains), T spans
 * several attention tiles and ends in a partial one, and C and 4C are not
 * multiples of the column blocks times the thread count.
 */
static void test_threads_and_kernels_same_bits(void)
{
    zr_gpt_config cfg = {200, 250, 256, 2, 3, 144};
    const int B = 2, T = 190;
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, &cfg, B, T));
    int *in = calloc((size_t)B * T, sizeof *in), *tg = calloc((size_t)B * T, sizeof *tg);
    TEST_CHECK(in != NULL && tg != NULL);
    random_tokens(in, B * T, cfg.vocab, 31);
    random_tokens(tg, B * T, cfg.vocab, 32);
    units ref, refm, refv, x, xm, xv;
    units_alloc(&ref, &m, 0);
    units_alloc(&refm, &m, 0);
    units_alloc(&refv, &m, 0);
    units_alloc(&x, &m, 0);
    units_alloc(&xm, &m, 0);
    units_alloc(&xv, &m, 0);
    zr_gpt_set_threads(1);
    float lref = train_step(&m, &ref, &refm, &refv, in, tg);
    /* thread counts 2 and 3, then the reference kernels at 1 and 2 threads */
    const int threads[] = {2, 3, 1, 2};
    for (int k = 0; k < 4; k++) {
        zr_ops_set_impl(k >= 2 ? ZR_OPS_IMPL_SCALAR : ZR_OPS_IMPL_AUTO);
        zr_gpt_set_threads(threads[k]);
        TEST_EQ_INT(zr_threads_get(), threads[k]);
        float l = train_step(&m, &x, &xm, &xv, in, tg);
        TEST_CHECKF(memcmp(&l, &lref, sizeof l) == 0, "%d threads, %s kernels: loss %.9g vs %.9g",
                    threads[k], zr_ops_impl_name(), l, lref);
        TEST_CHECKF(units_equal(&m, &x, &ref) && units_equal(&m, &xm, &refm) &&
                        units_equal(&m, &xv, &refv),
                    "%d threads, %s kernels: parameters, gradients or moments differ", threads[k],
                    zr_ops_impl_name());
    }
    zr_ops_set_impl(ZR_OPS_IMPL_AUTO);
    printf("  1, 2, 3 threads and the reference kernels agree bit for bit (vector path %s)\n",
           zr_ops_impl_name());
    zr_gpt_set_threads(1);
    units_free(&ref);
    units_free(&refm);
    units_free(&refv);
    units_free(&x);
    units_free(&xm);
    units_free(&xv);
    free(in);
    free(tg);
    zr_gpt_free(&m);
}

/*
 * The streamed attention against the same attention in double precision,
 * unblocked: T covers many key blocks and a partial tile, the scores span
 * about +-8 so the running max is rescaled often. The bound is stated
 * relative to max |v|: 2e-6 (about 16 float ulps of an output near |v|;
 * measured ~3e-7).
 */
static void test_attention_vs_fp64(void)
{
    const int B = 1, T = 333, NH = 2, C = 128, C3 = 3 * C;
    float *qkv = calloc((size_t)B * T * C3, sizeof *qkv);
    float *out = calloc((size_t)B * T * C, sizeof *out);
    float *lse = calloc((size_t)B * NH * T, sizeof *lse);
    double *ref = calloc((size_t)B * T * C, sizeof *ref);
    TEST_CHECK(qkv != NULL && out != NULL && lse != NULL && ref != NULL);
    zr_test_rng r = {77};
    float vmax = 0.0f;
    for (size_t i = 0; i < (size_t)B * T * C3; i++) {
        qkv[i] = 1.3f * zr_test_rng_normal(&r);
        vmax = (int)(i % C3) >= 2 * C && fabsf(qkv[i]) > vmax ? fabsf(qkv[i]) : vmax;
    }
    zr_op_attention_fwd(out, lse, qkv, B, T, C, NH);
    zr_op_attention_fwd_ref64(ref, qkv, B, T, C, NH);
    double worst = 0;
    for (size_t i = 0; i < (size_t)B * T * C; i++) {
        worst = fmax(worst, fabs((double)out[i] - ref[i]));
    }
    worst /= vmax;
    printf("  attention T=%d: max |out - fp64| / max |v| = %.3g (bound 2e-6)\n", T, worst);
    TEST_CHECKF(worst <= 2e-6, "attention differs from fp64 by %.3g of max |v|", worst);
    free(qkv);
    free(out);
    free(lse);
    free(ref);
}

/* Activations grow linearly in T: no T x T buffer anywhere (GPT-2 124M shapes). */
static void test_activation_memory_linear_in_t(void)
{
    zr_gpt_config c = {4096, 50257, 50304, 12, 12, 768};
    size_t m1 = zr_gpt_config_activation_bytes(&c, 1, 1024, 0);
    size_t m2 = zr_gpt_config_activation_bytes(&c, 1, 2048, 0);
    size_t m4 = zr_gpt_config_activation_bytes(&c, 1, 4096, 0);
    printf("  124M activations, B=1: T=1024 %.0f MiB, 2048 %.0f MiB, 4096 %.0f MiB\n",
           m1 / 1048576.0, m2 / 1048576.0, m4 / 1048576.0);
    TEST_CHECKF(m4 - m2 == 2 * (m2 - m1), "not linear in T: %zu %zu %zu", m1, m2, m4);
    zr_gpt_config bad = {64, 64, 64, 1, 1, 512};
    TEST_FAILS(zr_gpt_config_check(&bad), ZR_ERR_INVALID, "head size");
}

/*
 * The exp behind softmax and GELU over the whole float range: a sample of
 * every 251st bit pattern (both signs, subnormals, infinities, NaNs) plus
 * the edges. NaN stays NaN; everything else is finite and positive, within
 * a few ulp of exp on [-87, 88] and the clamped value outside. Under the
 * asan suite UBSan also sees that no input shifts a negative value.
 */
static void test_exp_range(void)
{
    enum { CHUNK = 4096 };
    static float in[CHUNK], out[CHUNK];
    const float lo_clamp = -87.0f, hi_clamp = 88.0f;
    float edge_in[2] = {lo_clamp, hi_clamp}, edge_out[2];
    zr_op_exp(edge_out, edge_in, 2);
    double worst = 0;
    long bad_nan = 0, bad_range = 0, bad_clamp = 0, count = 0;
    uint64_t u = 0;
    static const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                        0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x00000001u,
                                        0x80000001u, 0x7f7fffffu, 0xff7fffffu, 0x42ae0000u,
                                        0xc2ae0000u, 0x42b00000u, 0xc2b00000u, 0x42b17218u};
    size_t nspecial = sizeof specials / sizeof specials[0];
    while (u <= 0xffffffffull) {
        int n = 0;
        for (; n < CHUNK && u <= 0xffffffffull; n++) {
            uint32_t bits;
            if (count + n < (long)nspecial) {
                bits = specials[count + n];
            } else {
                bits = (uint32_t)u;
                u += 251;
            }
            memcpy(&in[n], &bits, sizeof bits);
        }
        zr_op_exp(out, in, (size_t)n);
        for (int i = 0; i < n; i++) {
            float x = in[i], y = out[i];
            if (isnan(x)) {
                bad_nan += !isnan(y);
                continue;
            }
            if (!(isfinite(y) && y > 0.0f)) {
                bad_range++;
                continue;
            }
            if (x < lo_clamp || x > hi_clamp) {
                bad_clamp += y != edge_out[x > 0];
                continue;
            }
            double want = exp((double)x);
            double rel = fabs((double)y - want) / want;
            worst = rel > worst ? rel : worst;
        }
        count += n;
    }
    TEST_CHECKF(bad_nan == 0, "%ld NaN inputs did not give NaN", bad_nan);
    TEST_CHECKF(bad_range == 0, "%ld inputs gave a non-finite or non-positive exp", bad_range);
    TEST_CHECKF(bad_clamp == 0, "%ld inputs outside [-87, 88] were not clamped", bad_clamp);
    /* 2 ulp of a float is 2^-22 relative at worst */
    TEST_CHECKF(worst < 2.4e-7, "worst relative error %.3g", worst);
    printf("  exp over %ld inputs: worst relative error %.3g on [-87, 88]\n", count, worst);
}

/*
 * --cpu NAME: run everything with the kernels capped at NAME (ZR_CPU): on a
 * wider CPU the AVX2 kernels are otherwise never run, and the bit-for-bit
 * comparison with the reference kernels covers them too.
 */
int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--cpu") == 0) {
        setenv("ZR_CPU", argv[2], 1);
        int has = strcmp(argv[2], "sse2") == 0;
#if defined(__x86_64__)
        __builtin_cpu_init();
        has |= strcmp(argv[2], "avx2") == 0 && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma");
        has |= strcmp(argv[2], "avx512") == 0 && __builtin_cpu_supports("avx512f");
#endif
        if (has) {
            TEST_CHECKF(
                strcmp(zr_ops_impl_name(), strcmp(argv[2], "sse2") == 0 ? "scalar" : argv[2]) == 0,
                "ZR_CPU=%s: the kernels are %s", argv[2], zr_ops_impl_name());
        }
        printf("  kernels capped at %s: %s\n", argv[2], zr_ops_impl_name());
    } else if (argc != 1) {
        fprintf(stderr, "usage: test_model [--cpu sse2|avx2|avx512]\n");
        return 2;
    }
    zr_gpt_set_threads(1);
    TEST_RUN(test_exp_range);
    TEST_RUN(test_layout);
    TEST_RUN(test_init);
    TEST_RUN(test_gradcheck_small);
    TEST_RUN(test_gradcheck_long);
    TEST_RUN(test_order_and_tokens);
    TEST_RUN(test_determinism_and_buffers);
    TEST_RUN(test_loss_falls);
    TEST_RUN(test_threads_and_kernels_same_bits);
    TEST_RUN(test_attention_vs_fp64);
    TEST_RUN(test_activation_memory_linear_in_t);
    return zr_test_finish();
}
