/*
 * test_zero.c - the ZeRO engine against the unsharded single-process result.
 *
 * Every rank also runs the reference: one process, the whole global batch,
 * every unit resident, AdamW on full buffers. The engine at W ranks must
 * follow its loss trajectory (relative difference <= 1e-5 per step, fp32 on
 * the wire) at stages 0-3, with parameters identical on every rank after
 * every step. Also: hpZ never reads a stale secondary (after a step, after a
 * load), model-state memory matches the plan's formula, non-finite gradients
 * skip the step on every rank, and the live-parameter budget holds. A dry
 * engine driven by the same calls reports exactly the traffic the real one
 * counts and ends every step with the same memory. An engine with bf16
 * working buffers (zr_engine_config.work_type) trains bit for bit the
 * trajectory of the fp32 engine whose model reads and sums in bf16, at every
 * stage and with ZeRO++, and the plain fp32 run's within 2^-9 of the loss.
 */
#define ZR_TEST_MPI
#include "test.h"

#include "zr/gpt_engine.h"
#include "zr/optim.h"

#include <math.h>

static int W, R;
static zr_comm comm;

static const zr_gpt_config TINY = {16, 64, 64, 2, 2, 32}; /* maxT, V, Vp, L, NH, C */
enum { B = 2, T = 16 };
static const float LR = 2e-3f;

/* Global batch for a step: W*B rows of T+1 tokens, the same on every rank. */
static void global_batch(int step, int *inputs, int *targets)
{
    zr_test_rng rng = {0x1234567ull + (uint64_t)step * 7919};
    for (int i = 0; i < W * B; i++) {
        /* a learnable sequence (next = 5*prev + 1 mod V) from a random start */
        int row[T + 1];
        row[0] = (int)(zr_test_rng_next(&rng) % (uint64_t)TINY.vocab);
        for (int t = 1; t <= T; t++) {
            row[t] = (row[t - 1] * 5 + 1) % TINY.vocab;
        }
        memcpy(inputs + (size_t)i * T, row, sizeof(int) * T);
        memcpy(targets + (size_t)i * T, row + 1, sizeof(int) * T);
    }
}

/* ---- the unsharded reference ------------------------------------------------ */

typedef struct reference {
    zr_gpt model;
    int n;
    float *p[8], *g[8], *m[8], *v[8];
    zr_gpt_specs specs;
    int t;
} reference;

static void ref_init(reference *r, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    TEST_OK(zr_gpt_init(&r->model, &TINY, W * B, T));
    TEST_OK(zr_gpt_specs_init(&r->specs, &TINY));
    r->n = zr_gpt_unit_count(&r->model);
    for (int u = 0; u < r->n; u++) {
        size_t n = zr_gpt_unit_numel(&r->model, u);
        TEST_OK(zr_alloc_at((void **)&r->p[u], n * 4, __FILE__, __LINE__));
        TEST_OK(zr_alloc_at((void **)&r->g[u], n * 4, __FILE__, __LINE__));
        TEST_OK(zr_alloc_at((void **)&r->m[u], n * 4, __FILE__, __LINE__));
        TEST_OK(zr_alloc_at((void **)&r->v[u], n * 4, __FILE__, __LINE__));
        zr_gpt_unit_init_params(&r->model, u, r->p[u], seed);
    }
}

static void ref_free(reference *r)
{
    for (int u = 0; u < r->n; u++) {
        zr_free(r->p[u]), zr_free(r->g[u]), zr_free(r->m[u]), zr_free(r->v[u]);
    }
    zr_gpt_specs_free(&r->specs);
    zr_gpt_free(&r->model);
}

static float ref_step(reference *r, const zr_engine_config *cfg, const int *in, const int *tg)
{
    int last = r->n - 1;
    TEST_OK(zr_gpt_forward_begin(&r->model, in, tg));
    for (int u = 0; u <= last; u++) {
        TEST_OK(zr_gpt_forward_unit(&r->model, u, r->p[u], r->p[0]));
    }
    float loss = zr_gpt_loss(&r->model);
    TEST_OK(zr_gpt_backward_begin(&r->model));
    for (int u = 0; u <= last; u++) {
        memset(r->g[u], 0, zr_gpt_unit_numel(&r->model, u) * 4);
    }
    for (int u = last; u >= 0; u--) {
        TEST_OK(zr_gpt_backward_unit(&r->model, u, r->p[u], r->p[0], r->g[u], r->g[0]));
    }
    double sq = 0;
    for (int u = 0; u <= last; u++) {
        sq += zr_sumsq(r->g[u], zr_gpt_unit_numel(&r->model, u));
    }
    float scale = zr_clip_scale(sqrt(sq), cfg->grad_clip);
    zr_adamw h = {LR, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay};
    r->t++;
    for (int u = 0; u <= last; u++) {
        const zr_unit_spec *s = &r->specs.units[u];
        for (int i = 0; i < s->nranges; i++) {
            size_t o = s->ranges[i].offset;
            zr_adamw_update(&h, LR, r->t, scale, s->ranges[i].decay, r->p[u] + o, r->g[u] + o,
                            r->m[u] + o, r->v[u] + o, s->ranges[i].numel);
        }
    }
    return loss;
}

/* ---- helpers on the engine side ---------------------------------------------- */

static int same_on_all_ranks(uint32_t x)
{
    uint32_t lo, hi;
    MPI_Allreduce(&x, &lo, 1, MPI_UINT32_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&x, &hi, 1, MPI_UINT32_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

/* Checksum of every unit's exact parameters and of the working copies the model sees. */
static uint32_t engine_checksum(zr_engine *e, const zr_gpt *m)
{
    uint32_t crc = 0;
    for (int u = 0; u < e->nunits; u++) {
        size_t n = zr_gpt_unit_numel(m, u);
        float *full = malloc(n * 4);
        TEST_OK(zr_engine_get_params(e, u, full));
        crc = zr_crc32c(crc, full, n * 4);
        free(full);
        const void *p;
        TEST_OK(zr_engine_fetch(e, u, ZR_PHASE_FORWARD, &p));
        crc = zr_crc32c(crc, p, n * zr_dtype_size(zr_engine_param_type(&e->cfg)));
        TEST_OK(zr_engine_release(e, u));
    }
    return crc;
}

static float global_loss(float local)
{
    double v = local;
    TEST_OK(zr_comm_allreduce_sum_f64(&comm, ZR_GROUP_WORLD, &v, 1));
    return (float)(v / W);
}

static zr_engine_config exact_config(int stage)
{
    zr_engine_config c = zr_engine_config_default();
    c.stage = stage;
    c.param_wire.type = ZR_WIRE_F32;
    c.grad_wire.type = ZR_WIRE_F32;
    c.max_live = 3 * 4096; /* small: prefetch must respect the budget */
    return c;
}

static void engine_up(zr_engine *e, zr_gpt *m, zr_gpt_specs *sp, const zr_engine_config *cfg,
                      uint64_t seed)
{
    TEST_OK(zr_gpt_init(m, &TINY, B, T));
    TEST_OK(zr_gpt_specs_init(sp, &TINY));
    TEST_OK(zr_engine_init(e, &comm, cfg, sp->nunits, sp->units));
    TEST_OK(zr_gpt_engine_init_params(e, &m->cfg, seed));
}

static void engine_down(zr_engine *e, zr_gpt *m, zr_gpt_specs *sp)
{
    zr_engine_free(e);
    zr_gpt_specs_free(sp);
    zr_gpt_free(m);
}

/* ---- a model that computes in bf16, on the CPU ------------------------------------ */

/*
 * The CPU model computes in fp32 and takes fp32 buffers only
 * (zr_gpt_engine_micro refuses an engine of bf16 working buffers), so an
 * engine with bf16 ones is driven here by the GPT's own schedule
 * (zr/gpt_engine.h, the same calls in the same order, so that a dry walk
 * matches it) with a model that reads bf16 weights and keeps bf16 gradient
 * sums, as the GPU's bf16 model does: each unit's parameters are read into
 * fp32 copies holding bf16 values (a bf16 buffer widened, an fp32 one
 * rounded), and each backward goes into zeroed fp32 scratch that is then
 * added into the engine's gradient buffer, as `storage` says the sums are
 * kept: bf16 (stages 2-3 of a bf16 engine) as bf16(buf + g), fp32 (stages
 * 0-1, which accumulate the micro-batches in fp32) as buf + bf16(g). Given
 * an fp32 engine and the bf16 engine's storage, it computes what the bf16
 * engine's model would, with every buffer of the engine in fp32.
 */
enum { MAX_UNITS = 8 };

typedef struct bf16_model {
    zr_dtype storage;
    float *p[MAX_UNITS], *g[MAX_UNITS]; /* per unit: parameters read, a backward's gradient */
} bf16_model;

static bf16_model bm_model; /* for TINY: engine_micro's scratch */

static float bf16_round(float x)
{
    return zr_bf16_to_f32(zr_bf16_from_f32(x));
}

static void bm_init(bf16_model *bm, zr_dtype storage)
{
    memset(bm, 0, sizeof *bm);
    bm->storage = storage;
    ZR_ASSERT(zr_gpt_config_unit_count(&TINY) <= MAX_UNITS);
    for (int u = 0; u < zr_gpt_config_unit_count(&TINY); u++) {
        size_t n = zr_gpt_config_unit_numel(&TINY, u);
        bm->p[u] = calloc(n, sizeof(float));
        bm->g[u] = calloc(n, sizeof(float));
    }
}

static void bm_free(bf16_model *bm)
{
    for (int u = 0; u < MAX_UNITS; u++) {
        free(bm->p[u]), free(bm->g[u]);
    }
    memset(bm, 0, sizeof *bm);
}

/* Unit u's parameters from the engine's buffer src, as bf16 values. */
static void bm_read(const zr_engine *e, int u, const void *src, float *dst)
{
    size_t n = zr_engine_numel(e, u);
    for (size_t i = 0; i < n; i++) {
        dst[i] = zr_engine_param_type(&e->cfg) == ZR_DTYPE_BF16
                     ? zr_bf16_to_f32(((const zr_bf16 *)src)[i])
                     : bf16_round(((const float *)src)[i]);
    }
}

/* Unit u's backward contribution g into the engine's gradient buffer, kept as storage says. */
static void bm_fold(const bf16_model *bm, const zr_engine *e, int u, void *buf, const float *g)
{
    size_t n = zr_engine_numel(e, u);
    int b16 = zr_engine_grad_type(&e->cfg) == ZR_DTYPE_BF16;
    for (size_t i = 0; i < n; i++) {
        float old = b16 ? zr_bf16_to_f32(((zr_bf16 *)buf)[i]) : ((float *)buf)[i];
        float sum = bm->storage == ZR_DTYPE_BF16 ? bf16_round(old + g[i]) : old + bf16_round(g[i]);
        if (b16) {
            ((zr_bf16 *)buf)[i] = zr_bf16_from_f32(sum);
        } else {
            ((float *)buf)[i] = sum;
        }
    }
}

/* Unit u's backward (the last unit's also into unit 0's scratch), folded into g (and g0). */
static void bm_backward(bf16_model *bm, zr_gpt *m, zr_engine *e, int u, void *g, void *g0)
{
    int last = e->nunits - 1;
    memset(bm->g[u], 0, zr_engine_numel(e, u) * sizeof(float));
    if (u == last) {
        memset(bm->g[0], 0, zr_engine_numel(e, 0) * sizeof(float));
    }
    TEST_OK(zr_gpt_backward_unit(m, u, u > 0 ? bm->p[u] : NULL, u == last ? bm->p[0] : NULL,
                                 bm->g[u], u == last ? bm->g[0] : NULL));
    bm_fold(bm, e, u, g, bm->g[u]);
    if (u == last) {
        bm_fold(bm, e, 0, g0, bm->g[0]);
    }
}

/* Forward through every unit in the GPT's order; leaves the last unit and unit 0 fetched. */
static void bm_forward(bf16_model *bm, zr_gpt *m, zr_engine *e, const int *in, const int *tg)
{
    int last = e->nunits - 1;
    const void *p, *p0;
    TEST_OK(zr_gpt_forward_begin(m, in, tg));
    TEST_OK(zr_engine_prefetch(e, 0, ZR_PHASE_FORWARD));
    for (int u = 0; u < last; u++) {
        TEST_OK(zr_engine_fetch(e, u, ZR_PHASE_FORWARD, &p));
        TEST_OK(zr_engine_prefetch(e, u + 1, ZR_PHASE_FORWARD));
        bm_read(e, u, p, bm->p[u]);
        TEST_OK(zr_gpt_forward_unit(m, u, bm->p[u], NULL));
        TEST_OK(zr_engine_release(e, u));
    }
    TEST_OK(zr_engine_prefetch(e, 0, ZR_PHASE_FORWARD));
    TEST_OK(zr_engine_fetch(e, last, ZR_PHASE_FORWARD, &p));
    TEST_OK(zr_engine_fetch(e, 0, ZR_PHASE_FORWARD, &p0));
    bm_read(e, last, p, bm->p[last]);
    bm_read(e, 0, p0, bm->p[0]);
    TEST_OK(zr_gpt_forward_unit(m, last, bm->p[last], bm->p[0]));
}

/* One micro-batch of the GPT's schedule (gpt_engine.c's micro) with the bf16 model. */
static float bm_micro(bf16_model *bm, zr_gpt *m, zr_engine *e, const int *in, const int *tg)
{
    int last = e->nunits - 1;
    TEST_OK(zr_engine_micro_begin(e));
    bm_forward(bm, m, e, in, tg);
    float loss = zr_gpt_loss(m);
    TEST_OK(zr_gpt_backward_begin(m));
    void *g, *g0;
    TEST_OK(zr_engine_grads(e, last, &g));
    TEST_OK(zr_engine_grads(e, 0, &g0));
    TEST_OK(zr_engine_prefetch(e, last - 1, ZR_PHASE_BACKWARD));
    bm_backward(bm, m, e, last, g, g0);
    TEST_OK(zr_engine_release(e, last));
    TEST_OK(zr_engine_release(e, 0));
    TEST_OK(zr_engine_grads_done(e, last));
    for (int u = last - 1; u >= 1; u--) {
        const void *p;
        TEST_OK(zr_engine_fetch(e, u, ZR_PHASE_BACKWARD, &p));
        TEST_OK(zr_engine_prefetch(e, u - 1 >= 1 ? u - 1 : -1, ZR_PHASE_BACKWARD));
        TEST_OK(zr_engine_grads(e, u, &g));
        bm_read(e, u, p, bm->p[u]);
        bm_backward(bm, m, e, u, g, NULL);
        TEST_OK(zr_engine_release(e, u));
        TEST_OK(zr_engine_grads_done(e, u));
    }
    bm_backward(bm, m, e, 0, g0, NULL);
    TEST_OK(zr_engine_grads_done(e, 0));
    return loss;
}

/* One micro-batch of this rank: the CPU model on an fp32 engine, the bf16 model on a bf16 one. */
static float engine_micro(zr_engine *e, zr_gpt *m, const int *in, const int *tg)
{
    float local = NAN;
    in += (size_t)R * B * T;
    tg += (size_t)R * B * T;
    if (zr_engine_param_type(&e->cfg) == ZR_DTYPE_F32 &&
        zr_engine_grad_type(&e->cfg) == ZR_DTYPE_F32) {
        zr_gpt_run run = zr_gpt_run_host(m);
        TEST_OK(zr_gpt_engine_micro(&run, e, in, tg, &local));
    } else {
        bm_model.storage = zr_engine_grad_type(&e->cfg);
        local = bm_micro(&bm_model, m, e, in, tg);
    }
    return local;
}

static float engine_step(zr_engine *e, zr_gpt *m, const int *in, const int *tg, zr_step_stats *st)
{
    float local = engine_micro(e, m, in, tg);
    TEST_OK(zr_engine_step(e, LR, st));
    return global_loss(local);
}

/* ---- tests --------------------------------------------------------------------- */

static void check_stage(int stage)
{
    enum { STEPS = 50 };
    zr_engine_config cfg = exact_config(stage);
    reference ref;
    ref_init(&ref, 42);
    zr_engine e;
    zr_gpt m;
    zr_gpt_specs sp;
    engine_up(&e, &m, &sp, &cfg, 42);
    int *in = malloc(sizeof(int) * W * B * T), *tg = malloc(sizeof(int) * W * B * T);
    double worst = 0;
    int agree = 1;
    float first = 0, last = 0;
    for (int s = 0; s < STEPS; s++) {
        global_batch(s, in, tg);
        float lr_ = ref_step(&ref, &cfg, in, tg);
        zr_step_stats st;
        float le = engine_step(&e, &m, in, tg, &st);
        double rel = fabs((double)le - lr_) / fabs((double)lr_);
        worst = rel > worst ? rel : worst;
        agree &= same_on_all_ranks(engine_checksum(&e, &m));
        TEST_CHECK(!st.skipped);
        if (stage == 3) {
            size_t biggest = 0;
            for (int u = 0; u < e.nunits; u++) {
                biggest = zr_engine_padded(&e, u) > biggest ? zr_engine_padded(&e, u) : biggest;
            }
            /* fetches may exceed the budget by what the tied head needs, prefetch never */
            TEST_CHECKF(st.live_peak <= cfg.max_live + 2 * biggest, "live peak %zu", st.live_peak);
        }
        if (s == 0) {
            first = lr_;
        }
        last = lr_;
    }
    TEST_CHECKF(worst <= 1e-5, "stage %d at %d ranks: worst relative loss difference %.3g", stage,
                W, worst);
    TEST_CHECKF(agree, "stage %d: parameters differ across ranks", stage);
    TEST_CHECKF(last < first - 0.05f, "stage %d: loss did not fall (%g -> %g)", stage, first, last);
    if (R == 0) {
        printf("  stage %d, %d ranks: %d steps, loss %.4f -> %.4f, worst rel diff %.2e\n", stage, W,
               STEPS, first, last, worst);
    }
    free(in);
    free(tg);
    engine_down(&e, &m, &sp);
    ref_free(&ref);
}

static void test_stage0(void)
{
    check_stage(0);
}
static void test_stage1(void)
{
    check_stage(1);
}
static void test_stage2(void)
{
    check_stage(2);
}
static void test_stage3(void)
{
    check_stage(3);
}

/*
 * With bf16 on the wire the working parameters are rounded copies; every rank
 * must hold the same rounded bits (its own shard included), or replicated
 * parameters would drift apart silently.
 */
static void test_bf16_ranks_agree(void)
{
    for (int stage = 0; stage <= 3; stage++) {
        zr_engine_config cfg = zr_engine_config_default();
        cfg.stage = stage;
        cfg.qwz = stage == 3;
        cfg.hpz = stage == 3;
        cfg.qgz = stage >= 2;
        zr_engine e;
        zr_gpt m;
        zr_gpt_specs sp;
        engine_up(&e, &m, &sp, &cfg, 11);
        int *in = malloc(sizeof(int) * W * B * T), *tg = malloc(sizeof(int) * W * B * T);
        int agree = 1;
        for (int s = 0; s < 5; s++) {
            global_batch(s, in, tg);
            zr_step_stats st;
            float loss = engine_step(&e, &m, in, tg, &st);
            TEST_CHECK(isfinite(loss));
            agree &= same_on_all_ranks(engine_checksum(&e, &m));
        }
        TEST_CHECKF(agree, "stage %d with bf16 (and ZeRO++ where it applies): ranks differ", stage);
        free(in);
        free(tg);
        engine_down(&e, &m, &sp);
    }
}

/*
 * hpZ with fp32 on the wire gathers the same bits as the primary, so its
 * trajectory must equal stage 3 without hpZ exactly. A secondary that
 * survived a step, or a load, would feed stale weights to the backward.
 */
static void test_hpz_fresh(void)
{
    zr_engine_config plain = exact_config(3), hpz = exact_config(3);
    hpz.hpz = 1;
    zr_engine e1, e2;
    zr_gpt m1, m2;
    zr_gpt_specs s1, s2;
    engine_up(&e1, &m1, &s1, &plain, 7);
    engine_up(&e2, &m2, &s2, &hpz, 7);
    int *in = malloc(sizeof(int) * W * B * T), *tg = malloc(sizeof(int) * W * B * T);
    int same = 1;
    zr_step_stats st;
    for (int s = 0; s < 6; s++) {
        global_batch(s, in, tg);
        if (s == 3) {
            /* a "checkpoint load": new parameters into both engines */
            for (int u = 0; u < e1.nunits; u++) {
                size_t n = zr_gpt_unit_numel(&m1, u);
                float *p = malloc(n * 4);
                zr_gpt_unit_init_params(&m1, u, p, 99);
                TEST_OK(zr_engine_set_params(&e1, u, p));
                TEST_OK(zr_engine_set_params(&e2, u, p));
                free(p);
            }
        }
        float a = engine_step(&e1, &m1, in, tg, &st);
        float b = engine_step(&e2, &m2, in, tg, &st);
        same &= a == b;
        /* the hpZ run gathered backward weights inside the node only */
        if (W > 1 && comm.size[ZR_GROUP_HPZ] > 1) {
            TEST_CHECK(st.traffic.kind[ZR_KIND_HPZ].calls > 0);
            TEST_EQ_INT(st.traffic.kind[ZR_KIND_HPZ].bytes_inter, 0);
        }
    }
    TEST_CHECKF(same, "hpZ trajectory differs from plain stage 3: stale secondary?");
    free(in);
    free(tg);
    engine_down(&e1, &m1, &s1);
    engine_down(&e2, &m2, &s2);
}

/*
 * A forward-only pass between steps (validation) must not change the
 * training trajectory: its releases cut hpZ secondaries from a qwZ gather,
 * and if those stayed valid the next step's forward would read them instead
 * of gathering from the primary shards. A run that validates and a run that
 * does not (a resumed run, say) must train bit for bit the same.
 */
static void test_eval_boundary(void)
{
    zr_engine_config c = exact_config(3);
    c.param_wire.type = ZR_WIRE_BF16;
    c.qwz = 1;
    c.hpz = 1;
    zr_engine e1, e2;
    zr_gpt m1, m2;
    zr_gpt_specs s1, s2;
    engine_up(&e1, &m1, &s1, &c, 11);
    engine_up(&e2, &m2, &s2, &c, 11);
    zr_gpt_run run1 = zr_gpt_run_host(&m1);
    int *in = malloc(sizeof(int) * W * B * T), *tg = malloc(sizeof(int) * W * B * T);
    int same = 1;
    zr_step_stats st;
    for (int s = 0; s < 5; s++) {
        global_batch(s, in, tg);
        if (s % 2 == 1) {
            float vloss = NAN;
            TEST_OK(zr_gpt_engine_eval(&run1, &e1, in + (size_t)R * B * T, tg + (size_t)R * B * T,
                                       &vloss));
            TEST_CHECK(isfinite(vloss));
        }
        float a = engine_step(&e1, &m1, in, tg, &st);
        float b = engine_step(&e2, &m2, in, tg, &st);
        same &= a == b;
    }
    TEST_CHECKF(same, "validation between steps changed the training losses");
    TEST_CHECK(engine_checksum(&e1, &m1) == engine_checksum(&e2, &m2));
    free(in);
    free(tg);
    engine_down(&e1, &m1, &s1);
    engine_down(&e2, &m2, &s2);
}

/* Model-state bytes per rank against the plan's formula (P = unpadded parameters). */
static void test_memory(void)
{
    /* a wider model so that padding stays well under the 5% tolerance */
    static const zr_gpt_config wide = {32, 256, 256, 2, 4, 64};
    zr_gpt_specs sp;
    TEST_OK(zr_gpt_specs_init(&sp, &wide));
    double P = 0;
    for (int u = 0; u < sp.nunits; u++) {
        P += (double)sp.units[u].numel;
    }
    int h = comm.size[ZR_GROUP_HPZ];
    for (int stage = 0; stage <= 3; stage++) {
        for (int v = 0; v < 2 * (1 + (stage == 3)); v++) {
            int hpz = v / 2, bf16 = v % 2;
            zr_engine_config cfg = zr_engine_config_default();
            cfg.stage = stage;
            cfg.hpz = hpz;
            cfg.work_type = bf16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
            zr_engine e;
            TEST_OK(zr_engine_init(&e, &comm, &cfg, sp.nunits, sp.units));
            zr_memory mem = zr_engine_memory(&e);
            double got = (double)(mem.params + mem.grads + mem.optim + mem.secondary);
            /* bytes per parameter: fp32 master+m+v (12), grads (4), the landing buffer of
               stage 1's reduce-scatter at the step (4), replicated working params (stage 1-2:
               4, or 2 in bf16); sharded gradients keep one float per shard element */
            double expect, work = bf16 ? 2 : 4;
            switch (stage) {
            case 0:
                expect = 16 * P;
                break; /* params are the masters, gradients fp32 in either work type */
            case 1:
                expect = work * P + 4 * P + 16 * P / W;
                break;
            case 2:
                expect = work * P + 16 * P / W;
                break;
            default:
                expect = 16 * P / W + (hpz ? 2 * P / h : 0);
                break;
            }
            TEST_CHECKF(fabs(got - expect) <= 0.05 * expect,
                        "stage %d hpz %d work %s at %d ranks: %.0f bytes, formula %.0f", stage, hpz,
                        zr_dtype_name(cfg.work_type), W, got, expect);
            zr_engine_free(&e);
        }
    }
    zr_gpt_specs_free(&sp);
}

/*
 * Two micro-batches per step (the shard accumulates), 4 steps; returns the
 * parameter checksum, the bits of every loss and the engine's pool peak.
 */
static uint32_t accum_run(const zr_engine_config *cfg, uint32_t *loss_bits, size_t *pool_peak,
                          size_t *pool_after_2)
{
    zr_engine e;
    zr_gpt m;
    zr_gpt_specs sp;
    engine_up(&e, &m, &sp, cfg, 9);
    zr_gpt_run run = zr_gpt_run_host(&m);
    int *in = malloc(sizeof(int) * W * B * T), *tg = malloc(sizeof(int) * W * B * T);
    *loss_bits = 0;
    for (int s = 0; s < 4; s++) {
        for (int k = 0; k < 2; k++) {
            global_batch(100 + 2 * s + k, in, tg);
            float local;
            TEST_OK(zr_gpt_engine_micro(&run, &e, in + (size_t)R * B * T, tg + (size_t)R * B * T,
                                        &local));
            uint32_t b;
            memcpy(&b, &local, sizeof b);
            *loss_bits = zr_crc32c(*loss_bits, &b, sizeof b);
        }
        zr_step_stats st;
        TEST_OK(zr_engine_step(&e, LR, &st));
        if (s == 1) {
            *pool_after_2 = zr_engine_memory(&e).pool_peak;
        }
    }
    zr_memory mem = zr_engine_memory(&e);
    *pool_peak = mem.pool_peak;
    /* the start-up prediction: model state exact, the pool bounded */
    zr_gpt_memory_prediction pr;
    TEST_OK(zr_gpt_engine_predict(&TINY, B, T, 0, cfg, &comm, &pr));
    TEST_EQ_INT(pr.state, mem.optim + mem.grads + mem.params + mem.secondary);
    TEST_CHECKF(pr.pool >= mem.pool_peak, "stage %d: predicted pool %zu < measured %zu", cfg->stage,
                pr.pool, mem.pool_peak);
    TEST_EQ_INT(pr.activations, zr_gpt_activation_bytes(&m));
    uint32_t crc = engine_checksum(&e, &m);
    free(in);
    free(tg);
    engine_down(&e, &m, &sp);
    return crc;
}

/*
 * How many gradient reductions are in flight (reduce_bucket_size) and whether
 * they overlap at all changes when zr waits, never what it computes: the
 * parameters and losses are bit-identical with one reduction in flight, with
 * all of them, and without overlap, with and without ZeRO++. A small bucket
 * holds less, and the pool stops growing after the first step.
 */
static void test_reduce_bucket_identical(void)
{
    for (int stage = 0; stage <= 3; stage++) {
        for (int zpp = 0; zpp <= (stage == 3); zpp++) {
            zr_engine_config base = zr_engine_config_default();
            base.stage = stage;
            base.qgz = zpp;
            base.qwz = zpp;
            base.hpz = zpp;
            zr_engine_config one = base, all = base, serial = base;
            one.reduce_bucket = 1;
            all.reduce_bucket = (size_t)1 << 40;
            serial.overlap = 0;
            uint32_t l1, l2, l3;
            size_t p1, p2, p3, q1, q2, q3;
            uint32_t c1 = accum_run(&one, &l1, &p1, &q1);
            uint32_t c2 = accum_run(&all, &l2, &p2, &q2);
            uint32_t c3 = accum_run(&serial, &l3, &p3, &q3);
            TEST_CHECKF(c1 == c2 && c2 == c3,
                        "stage %d zero++ %d: parameters differ (%08x %08x %08x)", stage, zpp, c1,
                        c2, c3);
            TEST_CHECKF(l1 == l2 && l2 == l3, "stage %d zero++ %d: losses differ", stage, zpp);
            TEST_CHECKF(p1 == q1 && p2 == q2 && p3 == q3,
                        "stage %d: the pool grew after the first steps (%zu -> %zu)", stage, q2,
                        p2);
            if (stage >= 2) {
                TEST_CHECKF(p1 < p2, "stage %d: one reduction in flight holds %zu bytes, all %zu",
                            stage, p1, p2);
            }
        }
    }
}

/* Checksum of every unit's master weights (as in engine_checksum) and of what the model reads. */
static uint32_t bf16_checksum(zr_engine *e, bf16_model *bm)
{
    uint32_t crc = 0;
    for (int u = 0; u < e->nunits; u++) {
        size_t n = zr_engine_numel(e, u);
        float *full = malloc(n * 4);
        TEST_OK(zr_engine_get_params(e, u, full));
        crc = zr_crc32c(crc, full, n * 4);
        free(full);
        const void *p;
        TEST_OK(zr_engine_fetch(e, u, ZR_PHASE_FORWARD, &p));
        bm_read(e, u, p, bm->p[u]);
        crc = zr_crc32c(crc, bm->p[u], n * 4);
        TEST_OK(zr_engine_release(e, u));
    }
    return crc;
}

/*
 * An engine with bf16 working buffers against the fp32 one. The rule
 * (zr/zero.h, "Types"): every bf16 working value is the bf16 rounding of
 * the value the fp32 engine holds, and every sum is fp32 in the same order.
 * So a bf16 engine trains, bit for bit, the trajectory of an fp32 engine
 * whose model reads its parameters rounded to bf16 and keeps its gradient
 * sums as the bf16 engine's buffers keep them (bf16_model): bound 0, at
 * every stage, on either wire, with ZeRO++ (qwZ decoding straight to bf16,
 * hpZ secondaries cut from bf16 units and gathered back, qgZ quantizing
 * bf16 gradients, error feedback), two micro-batches a step. A double
 * rounding, a sum in bf16 or in another order, a gradient that lost its fp32
 * accumulation over micro-batches, shows as a difference. The bf16 engine's
 * model state is the formula's, exactly, its pool is within the prediction,
 * and with bf16 on the wire below the fp32 engine's at stages 2-3 (half the
 * bytes of its gathered units and gradient buffers, and no cast buffers; an
 * fp32 wire needs fp32 staging of bf16 buffers, and holds more).
 */
static void check_bf16_engine(zr_engine_config c32, const char *what)
{
    zr_engine_config c16 = c32;
    c16.work_type = ZR_DTYPE_BF16;
    bf16_model bm32, bm16;
    bm_init(&bm32, zr_engine_grad_type(&c16)); /* the fp32 engine keeps sums as the bf16 one */
    bm_init(&bm16, zr_engine_grad_type(&c16));
    zr_engine e32, e16;
    zr_gpt m32, m16;
    zr_gpt_specs s32, s16;
    engine_up(&e32, &m32, &s32, &c32, 21);
    engine_up(&e16, &m16, &s16, &c16, 21);
    int *in = malloc(sizeof(int) * W * B * T), *tg = malloc(sizeof(int) * W * B * T);
    int same = 1;
    for (int s = 0; s < 4; s++) {
        for (int k = 0; k < 2; k++) {
            global_batch(200 + 2 * s + k, in, tg);
            const int *i0 = in + (size_t)R * B * T, *t0 = tg + (size_t)R * B * T;
            float a = bm_micro(&bm32, &m32, &e32, i0, t0);
            float b = bm_micro(&bm16, &m16, &e16, i0, t0);
            same &= memcmp(&a, &b, sizeof a) == 0;
        }
        zr_step_stats st32, st16;
        TEST_OK(zr_engine_step(&e32, LR, &st32));
        TEST_OK(zr_engine_step(&e16, LR, &st16));
        same &= st32.grad_norm == st16.grad_norm;
    }
    TEST_CHECKF(same, "%s: the bf16 engine's losses or norms differ from the fp32 engine's", what);
    TEST_CHECKF(bf16_checksum(&e32, &bm32) == bf16_checksum(&e16, &bm16),
                "%s: the bf16 engine's parameters differ from the fp32 engine's", what);
    zr_memory m = zr_engine_memory(&e16), f = zr_engine_memory(&e32);
    size_t padded = 0;
    for (int u = 0; u < e16.nunits; u++) {
        padded += zr_engine_padded(&e16, u);
    }
    zr_gpt_memory_prediction pr;
    TEST_OK(zr_gpt_engine_predict(&TINY, B, T, 0, &c16, &comm, &pr));
    TEST_EQ_INT(pr.state, m.optim + m.grads + m.params + m.secondary);
    TEST_CHECKF(pr.pool >= m.pool_peak, "%s: predicted pool %zu < measured %zu", what, pr.pool,
                m.pool_peak);
    TEST_CHECKF(m.params == (c32.stage == 1 || c32.stage == 2 ? 2 * padded : 0),
                "%s: working copy %zu bytes for %zu elements", what, m.params, padded);
    int bf16_wire = c32.param_wire.type == ZR_WIRE_BF16 && c32.grad_wire.type == ZR_WIRE_BF16;
    TEST_CHECKF(c32.stage < 2 || !bf16_wire || m.pool_peak < f.pool_peak,
                "%s: pool peak %zu, fp32 engine %zu", what, m.pool_peak, f.pool_peak);
    free(in);
    free(tg);
    engine_down(&e32, &m32, &s32);
    engine_down(&e16, &m16, &s16);
    bm_free(&bm32);
    bm_free(&bm16);
}

static void test_bf16_engine(void)
{
    for (int stage = 0; stage <= 3; stage++) {
        zr_engine_config c = zr_engine_config_default();
        c.stage = stage;
        c.max_live = 3 * 4096;
        char what[64];
        snprintf(what, sizeof what, "stage %d bf16 wire", stage);
        check_bf16_engine(c, what);
        c.param_wire.type = c.grad_wire.type = ZR_WIRE_F32;
        c.hpz = stage == 3;
        snprintf(what, sizeof what, "stage %d fp32 wire%s", stage, c.hpz ? ", hpZ" : "");
        check_bf16_engine(c, what);
    }
    zr_engine_config c = zr_engine_config_default();
    c.stage = 2;
    c.qgz = 1;
    check_bf16_engine(c, "stage 2 qgZ");
    c.stage = 3;
    c.qwz = c.hpz = 1;
    c.qgz_cfg.chunks = 2;
    c.qgz_cfg.error_feedback = 1;
    check_bf16_engine(c, "ZeRO++ (qwZ, hpZ, qgZ with error feedback)");
}

/*
 * The bf16 engine and model against the plain fp32 ones (the CPU model on an
 * fp32 engine), stage 3: bf16 keeps 8 significant bits, so each weight the
 * model reads and each gradient sum it keeps is off by up to 2^-9 relative,
 * while the master weights, moments and every reduction stay fp32, so the
 * errors do not compound. Over 30 steps the loss stays within one bf16
 * rounding of itself (2^-9 relative) of the fp32 run's (measured below 1e-4
 * at 1-3 ranks), and it trains.
 */
static void test_bf16_bound(void)
{
    zr_engine_config c32 = zr_engine_config_default(), c16 = c32;
    c16.work_type = ZR_DTYPE_BF16;
    zr_engine e32, e16;
    zr_gpt m32, m16;
    zr_gpt_specs s32, s16;
    engine_up(&e32, &m32, &s32, &c32, 42);
    engine_up(&e16, &m16, &s16, &c16, 42);
    int *in = malloc(sizeof(int) * W * B * T), *tg = malloc(sizeof(int) * W * B * T);
    double worst = 0;
    float first = 0, last = 0;
    for (int s = 0; s < 30; s++) {
        global_batch(s, in, tg);
        zr_step_stats st;
        float a = engine_step(&e32, &m32, in, tg, &st);
        float b = engine_step(&e16, &m16, in, tg, &st);
        worst = fmax(worst, fabs((double)b - a) / a);
        first = s == 0 ? b : first;
        last = b;
    }
    TEST_CHECKF(worst <= 1.0 / 512, "bf16 engine at %d ranks: worst relative loss difference %.3g",
                W, worst);
    TEST_CHECKF(last < first - 0.05f, "bf16 engine: loss did not fall (%g -> %g)", first, last);
    if (R == 0) {
        printf("  bf16 engine, stage 3, %d ranks: loss %.4f -> %.4f, worst rel diff to fp32 %.2e\n",
               W, first, last, worst);
    }
    free(in);
    free(tg);
    engine_down(&e32, &m32, &s32);
    engine_down(&e16, &m16, &s16);
}

static void test_nonfinite_skips(void)
{
    for (int stage = 0; stage <= 3; stage += 3) {
        zr_engine_config cfg = exact_config(stage);
        zr_engine e;
        zr_gpt m;
        zr_gpt_specs sp;
        engine_up(&e, &m, &sp, &cfg, 5);
        uint32_t before = engine_checksum(&e, &m);
        TEST_OK(zr_engine_micro_begin(&e));
        for (int u = e.nunits - 1; u >= 0; u--) {
            float *g; /* fp32 working buffers */
            TEST_OK(zr_engine_grads(&e, u, (void **)&g));
            g[0] = 0.5f;
            if (u == 1 && R == W - 1) {
                g[3] = NAN; /* one rank sees a NaN the others cannot */
            }
            TEST_OK(zr_engine_grads_done(&e, u));
        }
        zr_step_stats st;
        zr_log_level_set(ZR_LOG_ERROR); /* the skip warning is expected */
        TEST_OK(zr_engine_step(&e, LR, &st));
        zr_log_level_set(ZR_LOG_WARN);
        TEST_CHECK(st.skipped);
        TEST_CHECK(same_on_all_ranks((uint32_t)st.skipped));
        TEST_CHECK(engine_checksum(&e, &m) == before);
        engine_down(&e, &m, &sp);
    }
}

/*
 * The usage sketch at the top of zr/zero.h, line for line, on a toy model:
 * unit u's loss is the dot product of its parameters with a fixed x[u], so
 * its gradient is x[u] on every rank.
 */
enum { SKETCH_UNITS = 2 };

static zr_status sketch_micro(zr_engine *e, int nunits, float *const *x, const size_t *numel,
                              float lr, double *loss)
{
    const void *pv;
    void *gv;
    zr_step_stats stats;
    ZR_CHECK(zr_engine_micro_begin(e));
    for (int u = 0; u < nunits; u++) {
        ZR_CHECK(zr_engine_prefetch(e, u, ZR_PHASE_FORWARD));
        ZR_CHECK(zr_engine_fetch(e, u, ZR_PHASE_FORWARD, &pv));
        const float *p = pv; /* fp32 working buffers */
        for (size_t i = 0; i < numel[u]; i++) {
            *loss += (double)p[i] * x[u][i];
        }
        ZR_CHECK(zr_engine_release(e, u));
    }
    for (int u = nunits - 1; u >= 0; u--) {
        ZR_CHECK(zr_engine_fetch(e, u, ZR_PHASE_BACKWARD, &pv));
        ZR_CHECK(zr_engine_grads(e, u, &gv));
        float *g = gv;
        for (size_t i = 0; i < numel[u]; i++) {
            g[i] += x[u][i];
        }
        ZR_CHECK(zr_engine_release(e, u));
        ZR_CHECK(zr_engine_grads_done(e, u));
    }
    ZR_CHECK(zr_engine_step(e, lr, &stats));
    TEST_CHECK(!stats.skipped);
    return ZR_OK;
}

static void test_usage_sketch(void)
{
    const size_t numel[SKETCH_UNITS] = {40, 17};
    const zr_range ranges[SKETCH_UNITS] = {{0, 40, 1}, {0, 17, 0}};
    zr_unit_spec units[SKETCH_UNITS];
    float *x[SKETCH_UNITS], *p0[SKETCH_UNITS], *want[SKETCH_UNITS], *got[SKETCH_UNITS];
    float *m[SKETCH_UNITS], *v[SKETCH_UNITS];
    double sq = 0;
    for (int u = 0; u < SKETCH_UNITS; u++) {
        units[u] = (zr_unit_spec){numel[u], 1, &ranges[u]};
        float **bufs[] = {&x[u], &p0[u], &want[u], &got[u], &m[u], &v[u]};
        for (int k = 0; k < 6; k++) {
            TEST_OK(zr_alloc_at((void **)bufs[k], numel[u] * 4, __FILE__, __LINE__));
        }
        for (size_t i = 0; i < numel[u]; i++) {
            x[u][i] = 0.01f * (float)((int)(i * 7 + (size_t)u * 3) % 11 - 5);
            p0[u][i] = 0.1f - 0.003f * (float)i;
            sq += (double)x[u][i] * x[u][i];
        }
    }
    for (int stage = 0; stage <= 3; stage++) {
        zr_engine_config cfg = exact_config(stage);
        zr_engine e;
        TEST_OK(zr_engine_init(&e, &comm, &cfg, SKETCH_UNITS, units));
        double loss = 0, want_loss = 0;
        for (int u = 0; u < SKETCH_UNITS; u++) {
            TEST_OK(zr_engine_set_params(&e, u, p0[u]));
            for (size_t i = 0; i < numel[u]; i++) {
                want_loss += (double)p0[u][i] * x[u][i];
            }
        }
        TEST_OK(sketch_micro(&e, SKETCH_UNITS, x, numel, LR, &loss));
        TEST_CHECKF(fabs(loss - want_loss) <= 1e-6, "stage %d: loss %.9g, expected %.9g", stage,
                    loss, want_loss);
        /* one AdamW step on the full buffers with the averaged (= every rank's) gradient */
        zr_adamw h = {LR, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay};
        float scale = zr_clip_scale(sqrt(sq), cfg.grad_clip);
        double worst = 0;
        for (int u = 0; u < SKETCH_UNITS; u++) {
            memcpy(want[u], p0[u], numel[u] * 4);
            memset(m[u], 0, numel[u] * 4);
            memset(v[u], 0, numel[u] * 4);
            zr_adamw_update(&h, LR, 1, scale, ranges[u].decay, want[u], x[u], m[u], v[u], numel[u]);
            TEST_OK(zr_engine_get_params(&e, u, got[u]));
            for (size_t i = 0; i < numel[u]; i++) {
                double d = fabs((double)got[u][i] - want[u][i]);
                worst = d > worst ? d : worst;
            }
        }
        TEST_CHECKF(worst <= 1e-6, "stage %d: parameters after the step differ by %.3g", stage,
                    worst);
        zr_engine_free(&e);
    }
    for (int u = 0; u < SKETCH_UNITS; u++) {
        zr_free(x[u]), zr_free(p0[u]), zr_free(want[u]), zr_free(got[u]), zr_free(m[u]),
            zr_free(v[u]);
    }
}

/* ---- dry runs ------------------------------------------------------------------ */

/* A dry engine's observer that counts the traffic its collectives would account. */
static void count_posts(void *ctx, const zr_engine_event *ev)
{
    zr_traffic *t = ctx;
    if (ev->type == ZR_ENGINE_POST) {
        zr_traffic_row *row = &t->kind[ev->cost.kind];
        row->calls += ev->cost.exchanges;
        row->bytes_intra += ev->cost.intra[0] + ev->cost.intra[1];
        row->bytes_inter += ev->cost.inter[0] + ev->cost.inter[1];
    }
}

/* Real and dry run side by side for three steps of two micro-batches. */
static void check_dry(const zr_engine_config *cfg, const zr_comm *layout, const char *what)
{
    zr_engine e, d;
    zr_gpt m;
    zr_gpt_specs sp;
    engine_up(&e, &m, &sp, cfg, 5);
    zr_traffic dry;
    zr_engine_observer obs = {count_posts, &dry};
    TEST_OK(zr_engine_init_dry(&d, (zr_comm *)layout, cfg, sp.nunits, sp.units, obs));
    for (int u = 0; u < sp.nunits; u++) {
        TEST_OK(zr_engine_set_params(&d, u, NULL));
    }
    int *in = malloc(sizeof(int) * W * B * T), *tg = malloc(sizeof(int) * W * B * T);
    for (int s = 0; s < 3; s++) {
        zr_traffic before = zr_comm_traffic_get(&comm);
        memset(&dry, 0, sizeof dry);
        zr_step_stats st, dst;
        for (int k = 0; k < 2; k++) {
            global_batch(40 + 2 * s + k, in, tg);
            (void)engine_micro(&e, &m, in, tg);
            TEST_OK(zr_gpt_engine_walk(&d));
        }
        TEST_OK(zr_engine_step(&e, LR, &st));
        TEST_OK(zr_engine_step(&d, LR, &dst));
        zr_traffic after = zr_comm_traffic_get(&comm);
        for (int k = 0; k < ZR_KIND_COUNT; k++) {
            if (k == ZR_KIND_CONTROL) {
                continue; /* norms and losses: a dry engine has none */
            }
            zr_traffic_row *a = &before.kind[k], *b = &after.kind[k], *r = &dry.kind[k];
            TEST_CHECKF(
                b->calls - a->calls == r->calls &&
                    b->bytes_intra - a->bytes_intra == r->bytes_intra &&
                    b->bytes_inter - a->bytes_inter == r->bytes_inter,
                "%s, step %d, %s: real %llu calls %llu/%llu bytes, dry %llu calls "
                "%llu/%llu",
                what, s, zr_kind_name((zr_kind)k), (unsigned long long)(b->calls - a->calls),
                (unsigned long long)(b->bytes_intra - a->bytes_intra),
                (unsigned long long)(b->bytes_inter - a->bytes_inter), (unsigned long long)r->calls,
                (unsigned long long)r->bytes_intra, (unsigned long long)r->bytes_inter);
        }
        zr_memory rm = zr_engine_memory(&e), dm = zr_engine_memory(&d);
        TEST_CHECKF(rm.params == dm.params && rm.grads == dm.grads && rm.optim == dm.optim &&
                        rm.secondary == dm.secondary && rm.pool == dm.pool &&
                        rm.pool_peak == dm.pool_peak,
                    "%s, step %d: real pool %zu peak %zu, dry %zu peak %zu", what, s, rm.pool,
                    rm.pool_peak, dm.pool, dm.pool_peak);
        TEST_CHECKF(st.live_peak == dst.live_peak && st.zero3_bytes_inter == dst.zero3_bytes_inter,
                    "%s, step %d: live peak %zu / %zu, ZeRO-3 shadow %llu / %llu", what, s,
                    st.live_peak, dst.live_peak, (unsigned long long)st.zero3_bytes_inter,
                    (unsigned long long)dst.zero3_bytes_inter);
    }
    float x;
    TEST_FAILS(zr_engine_get_params(&d, 0, &x), ZR_ERR_INVALID, "dry engine");
    free(in);
    free(tg);
    zr_engine_free(&d);
    engine_down(&e, &m, &sp);
}

/*
 * A dry engine over this rank's layout built without MPI, driven by the same
 * calls (zr_gpt_engine_walk in place of the micro-batch), reports in every
 * step exactly the exchanges and bytes the real engine's counters count, and
 * ends each step with the same model state, pool and pool peak, live peak
 * and ZeRO-3 shadow count: it takes the real run's decisions.
 */
static void test_dry_run(void)
{
    zr_comm layout;
    TEST_OK(zr_comm_init_layout(&layout, comm.n_nodes, comm.ranks_per_node, comm.size[ZR_GROUP_HPZ],
                                R));
    for (int stage = 0; stage <= 3; stage++) {
        zr_engine_config cfg = zr_engine_config_default();
        cfg.stage = stage;
        cfg.reduce_bucket = 3000; /* several reductions queued */
        char what[64];
        snprintf(what, sizeof what, "stage %d bf16", stage);
        check_dry(&cfg, &layout, what);
        if (stage % 2 == 1) {
            cfg = exact_config(stage); /* fp32, a small live budget */
            snprintf(what, sizeof what, "stage %d fp32", stage);
            check_dry(&cfg, &layout, what);
        }
    }
    /* bf16 working buffers: the all-gathers' and reduce-scatters' other types and workspaces */
    for (int stage = 1; stage <= 3; stage++) {
        for (int wire = 0; wire < 2; wire++) {
            zr_engine_config cfg = zr_engine_config_default();
            cfg.stage = stage;
            cfg.work_type = ZR_DTYPE_BF16;
            cfg.reduce_bucket = 3000;
            cfg.hpz = stage == 3 && wire;
            if (wire) {
                cfg.param_wire.type = cfg.grad_wire.type = ZR_WIRE_F32;
            }
            char what[64];
            snprintf(what, sizeof what, "stage %d bf16 work, %s wire", stage,
                     wire ? "fp32" : "bf16");
            check_dry(&cfg, &layout, what);
        }
    }
    zr_engine_config cfg = zr_engine_config_default();
    cfg.qwz = cfg.hpz = cfg.qgz = 1;
    cfg.qgz_cfg.chunks = 2;
    cfg.qgz_cfg.error_feedback = 1;
    cfg.prefetch_bucket = 5000;
    check_dry(&cfg, &layout, "ZeRO++");
    cfg.work_type = ZR_DTYPE_BF16;
    check_dry(&cfg, &layout, "ZeRO++ bf16 work");
    cfg.work_type = ZR_DTYPE_F32;
    cfg.overlap = 0;
    check_dry(&cfg, &layout, "ZeRO++ without overlap");
}

static void test_bad_config(void)
{
    zr_gpt_specs sp;
    TEST_OK(zr_gpt_specs_init(&sp, &TINY));
    zr_engine e;
    zr_engine_config cfg = zr_engine_config_default();
    cfg.stage = 4;
    TEST_FAILS(zr_engine_init(&e, &comm, &cfg, sp.nunits, sp.units), ZR_ERR_INVALID, "stage");
    cfg = zr_engine_config_default();
    cfg.stage = 2;
    cfg.qwz = 1;
    TEST_FAILS(zr_engine_init(&e, &comm, &cfg, sp.nunits, sp.units), ZR_ERR_INVALID,
               "needs zero_optimization.stage 3");
    cfg = zr_engine_config_default();
    cfg.stage = 1;
    cfg.qgz = 1;
    TEST_FAILS(zr_engine_init(&e, &comm, &cfg, sp.nunits, sp.units), ZR_ERR_INVALID, "qgZ");
    cfg = zr_engine_config_default();
    cfg.work_type = (zr_dtype)7;
    TEST_FAILS(zr_engine_init(&e, &comm, &cfg, sp.nunits, sp.units), ZR_ERR_INVALID,
               "working type must be fp32 or bf16");
    zr_gpt_specs_free(&sp);
    /* the CPU model computes in fp32: it refuses an engine of bf16 working buffers */
    cfg = zr_engine_config_default();
    cfg.work_type = ZR_DTYPE_BF16;
    zr_gpt m;
    engine_up(&e, &m, &sp, &cfg, 3);
    zr_gpt_run run = zr_gpt_run_host(&m);
    int *in = calloc((size_t)B * T, sizeof(int)), *tg = calloc((size_t)B * T, sizeof(int));
    float loss;
    TEST_FAILS(zr_gpt_engine_micro(&run, &e, in, tg, &loss), ZR_ERR_INVALID,
               "bf16 parameters and bf16 gradients");
    TEST_FAILS(zr_gpt_engine_eval(&run, &e, in, tg, &loss), ZR_ERR_INVALID, "computes in fp32");
    free(in);
    free(tg);
    engine_down(&e, &m, &sp);
}

int main(int argc, char **argv)
{
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    zr_gpt_set_threads(1);
    if (zr_comm_init(&comm, MPI_COMM_WORLD, NULL) != ZR_OK) {
        fprintf(stderr, "communicator: %s\n", zr_error_message());
        return 1;
    }
    bm_init(&bm_model, ZR_DTYPE_BF16);
    TEST_RUN(test_stage0);
    TEST_RUN(test_stage1);
    TEST_RUN(test_stage2);
    TEST_RUN(test_stage3);
    TEST_RUN(test_bf16_ranks_agree);
    TEST_RUN(test_bf16_engine);
    TEST_RUN(test_bf16_bound);
    TEST_RUN(test_hpz_fresh);
    TEST_RUN(test_eval_boundary);
    TEST_RUN(test_memory);
    TEST_RUN(test_reduce_bucket_identical);
    TEST_RUN(test_nonfinite_skips);
    TEST_RUN(test_bad_config);
    TEST_RUN(test_usage_sketch);
    TEST_RUN(test_dry_run);
    bm_free(&bm_model);
    zr_comm_free(&comm);
    return zr_test_finish();
}
