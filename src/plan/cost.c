/*
 * cost.c - the cost model: bytes, memory and step time of one configuration
 * on one layout, predicted before anything is allocated.
 *
 * Nothing here re-implements the engine. The model builds a dry engine
 * (zr_engine_init_dry) over the layout, with the configuration the trainer
 * gives it (zr_config_engine), and drives it as the trainer does: the parameters set, then
 * steps of micro-batches (zr_gpt_engine_walk: the GPT's own schedule) and
 * zr_engine_step. The engine takes every decision of the real run (prefetch
 * and max-live budgets, the reduction queue, hpZ secondaries, the stage 0-2
 * refresh, its pool) and reports, instead of running them, the collectives
 * with what their algorithms say they send and convert (zr_coll_cost), its
 * own CPU work, and each unit's computation. This file only prices those
 * events:
 *
 *   bytes    summed per kind, so tests/test_plan.c can require equality with
 *            the engine's counters; memory: model state and activations from
 *            zr_gpt_engine_predict, the pool's peak from the dry engine's own
 *            pool, exactly
 *   time     compute of each unit (forward, backward) from the probe; the CPU
 *            work of collectives (conversions, quantization, sums: zr has no
 *            progress thread, so it is on the critical path) and of the
 *            engine at the probe's per-element rates; each transfer from its
 *            bytes and the measured bandwidth (at its messages' size: the
 *            probe measures two) and latency of its level (one rank's intra-
 *            and inter-node bytes of a hop go out at once; hops follow each
 *            other)
 *
 * A transfer posted before computation (prefetch, asynchronous reduction)
 * advances during it at the probe's measured overlap fraction; what is left
 * when its rank waits is exposed. Transfers complete in the order they were
 * posted (one link per rank), so a wait also exposes what was posted before
 * it.
 *
 * Calibration (the probe's reference steps, probe_ref.c; the fit is
 * calibrate.c's): the rates above
 * are measured on warm caches with every rank doing the same thing, and a
 * training step is neither. The probe ran ZeRO-3 without and with qwZ and
 * qgZ (the most and the fewest bytes) and stage 0 on the real engine; they
 * are priced here first, and fitted to what they measured (zr_plan_calibrate,
 * once per plan):
 *
 *   k_compute, c_byte   the step's computation and CPU work (outside waits
 *            and the optimizer) = k_compute x (units + codecs) + c_byte x
 *            the rank's inter-node bytes: the whole model's state is out of
 *            cache, and on ranks that share cores the network stack's work
 *            on every byte is time the computation does not get
 *   k_optim  the optimizer's measured over priced time
 *   t_sync   the least a synchronising wait exposes (a rank descheduled
 *            while its peers arrive), and
 *   k_comm   a scale on transfer times: in a step a transfer can take longer
 *            than in the probe, whose cores did nothing else, or hide better
 *            behind computation than the probe's overlap says. For stage 3
 *            the pair that lands both references' exposed time where they
 *            measured (a floor alone adds alike to two steps whose bytes
 *            differ by half); for one reference, the floor, or a scale under
 *            1 where it waited less than its transfers say. Both are fitted
 *            with the computation already calibrated: its length sets how
 *            much of a transfer the overlap hides
 *
 * all from the two ZeRO-3 references, for stage 3. Stages 0-2 reduce at the
 * step what stage 3 reduces during backward, and stage 0 updates the whole
 * model on every rank: their waits (t_sync or k_comm) and stage 0's k_optim
 * come from the stage 0 reference, where it fitted the node's memory. The fit
 * reproduces the references; every other configuration is predicted from it
 * (bench/cluster/run.sh --plan measures how well).
 *
 * A GPU probe (zr.device): the same schedule and calibration with the GPU's
 * figures, but a collective's conversions and (de)quantization are kernels
 * on its own codec stream, between its hops: they lengthen the transfer (and
 * hide behind computation with it) instead of adding to the step, and no
 * c_byte is fitted (k_comm prices what bytes cost). The engine's own work
 * (zeroing, folding, the hpZ cut, the optimizer) is on the computing stream,
 * as on the CPU. Memory is the GPU's: the device model's bytes in place of
 * the CPU's activations, against the GPU's free memory.
 */
#include "probe_impl.h"

#include "zr/config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct pending {
    const void *op; /* the collective's op (the engine reuses it after the wait) */
    double left;    /* seconds of its transfer still to go */
    double t;       /* seconds of its transfer (0: nothing to exchange, no synchronisation) */
} pending;

/* The calibration (see above); {1, 0, 1, 1, 0} leaves the probe's rates as they are. */
typedef zr_plan_calib calib;

typedef struct sim {
    const zr_probe *p; /* NULL: bytes and memory only */
    zr_probe_compute pc;
    calib cal;
    int last; /* the head unit (final LayerNorm and LM head) */
    pending *pend;
    int npend, maxpend;
    /* non-NULL: the exposure of each synchronising wait of the step, before t_sync */
    double *waits;
    int nwaits, maxwaits;
    zr_plan_cost *out;
} sim;

/* A per-element cost of the probe; 0 without one. */
#define RATE(s, field) ((s)->p != NULL ? (s)->p->field : 0.0)

/*
 * Seconds of one hop: intra and inter bytes of this rank go out at once, each
 * level's at the per-byte time of its messages' size: the probe's two sizes,
 * linear in log size between them, the nearer one's outside (no
 * extrapolation beyond what was measured).
 */
static double level_time(const sim *s, const zr_coll_cost *k, int hop)
{
    const zr_probe *p = s->p;
    const double bytes[2] = {(double)k->intra[hop], (double)k->inter[hop]},
                 msgs[2] = {(double)k->intra_msgs[hop], (double)k->inter_msgs[hop]};
    double t[2] = {0, 0};
    for (int l = 0; p != NULL && l < 2; l++) {
        if (!(bytes[l] > 0)) {
            continue;
        }
        double bw = l ? p->inter_bw : p->intra_bw,
               small = l ? p->inter_bw_small : p->intra_bw_small;
        double msg = bytes[l] / fmax(msgs[l], 1), per = 1 / bw;
        if (p->bw_msg_small > 0 && small > 0 && msg < p->bw_msg) {
            double f = log(fmax(msg, p->bw_msg_small) / p->bw_msg_small) /
                       log(p->bw_msg / p->bw_msg_small);
            per = (1 - f) / small + f / bw;
        }
        t[l] = (l ? p->inter_lat : p->intra_lat) + bytes[l] * per;
    }
    return fmax(t[0], t[1]);
}

/* Seconds of the CPU work around a collective's exchanges. */
static double coll_codec(const sim *s, const zr_coll_cost *k)
{
    if (s->p == NULL) {
        return 0;
    }
    int q = k->q_bits == 8 ? 0 : 1;
    return (double)k->bf16_enc * s->p->bf16_enc + (double)k->bf16_dec * s->p->bf16_dec +
           (double)k->f32_add * s->p->f32_add + (double)k->q_enc * s->p->q_enc[q] +
           (double)k->q_dec * s->p->q_dec[q];
}

static void post(sim *s, const void *op, const zr_coll_cost *k)
{
    zr_traffic_row *row = &s->out->traffic.kind[k->kind];
    row->calls += k->exchanges;
    row->bytes_intra += k->intra[0] + k->intra[1];
    row->bytes_inter += k->inter[0] + k->inter[1];
    double t = s->cal.k_comm * (level_time(s, k, 0) + level_time(s, k, 1));
    if (s->p != NULL && s->p->gpu) {
        t += coll_codec(s, k); /* on the op's codec stream, between its hops */
    } else {
        s->out->t_codec += s->cal.k_compute * coll_codec(s, k) +
                           s->cal.c_byte * (double)(k->inter[0] + k->inter[1]);
    }
    s->out->t_comm += t;
    ZR_ASSERT(s->npend < s->maxpend);
    s->pend[s->npend++] = (pending){op, t, t};
}

/* Wait for the transfer on op: it and everything posted before it are exposed. */
static void wait_for(sim *s, const void *op)
{
    int k = -1;
    for (int i = 0; i < s->npend; i++) {
        if (s->pend[i].op == op) {
            k = i;
        }
    }
    if (k < 0) {
        return;
    }
    double exposed = 0;
    for (int i = 0; i <= k; i++) {
        exposed += s->pend[i].left;
    }
    if (s->pend[k].t > 0) {
        /* it synchronises with its peers */
        if (s->waits != NULL) {
            ZR_ASSERT(s->nwaits < s->maxwaits);
            s->waits[s->nwaits++] = exposed;
        }
        exposed = fmax(exposed, s->cal.t_sync);
    }
    s->out->t_exposed += exposed;
    memmove(s->pend, s->pend + k + 1, sizeof(pending) * (size_t)(s->npend - k - 1));
    s->npend -= k + 1;
}

/* Computation of this many seconds: transfers in flight advance at the overlap fraction. */
static void compute(sim *s, double seconds)
{
    seconds *= s->cal.k_compute;
    s->out->t_compute += seconds;
    double budget = s->p != NULL ? s->p->overlap * seconds : 0;
    for (int i = 0; i < s->npend && budget > 0; i++) {
        double d = fmin(budget, s->pend[i].left);
        s->pend[i].left -= d;
        budget -= d;
    }
}

/* The probe's seconds for unit u's forward or backward: embedding, block or head. */
static double unit_seconds(const sim *s, int u, zr_phase phase)
{
    const zr_probe_compute *c = &s->pc;
    if (phase == ZR_PHASE_FORWARD) {
        return u == 0 ? c->fwd_embed : u == s->last ? c->fwd_head : c->fwd_block;
    }
    return u == 0 ? c->bwd_embed : u == s->last ? c->bwd_head : c->bwd_block;
}

/* The engine's own CPU work: around the collectives (codecs), or the optimizer step's. */
static void work(sim *s, zr_engine_work w, double n)
{
    n *= w == ZR_WORK_NORM || w == ZR_WORK_CLEAR || w == ZR_WORK_ADAMW ? s->cal.k_optim
                                                                       : s->cal.k_compute;
    switch (w) {
    case ZR_WORK_HPZ_CUT:
        s->out->t_codec += n * RATE(s, bf16_enc);
        return;
    case ZR_WORK_GRAD_ZERO:
        s->out->t_codec += n * RATE(s, sumsq);
        return;
    case ZR_WORK_GRAD_FOLD:
        s->out->t_codec += n * RATE(s, f32_add);
        return;
    case ZR_WORK_NORM:
    case ZR_WORK_CLEAR:
        s->out->t_optim += n * RATE(s, sumsq);
        return;
    case ZR_WORK_ADAMW:
        s->out->t_optim += n * RATE(s, adamw);
        return;
    }
}

static void observe(void *ctx, const zr_engine_event *ev)
{
    sim *s = ctx;
    switch (ev->type) {
    case ZR_ENGINE_POST:
        post(s, ev->op, &ev->cost);
        return;
    case ZR_ENGINE_WAIT:
        wait_for(s, ev->op);
        return;
    case ZR_ENGINE_WORK:
        work(s, ev->work, (double)ev->elements);
        return;
    case ZR_ENGINE_COMPUTE:
        compute(s, unit_seconds(s, ev->unit, ev->phase));
        return;
    }
}

/* ---- compute per micro-batch from the probe -------------------------------------- */

static double lerp(double x0, double y0, double x1, double y1, double x)
{
    return x1 == x0 ? y0 : y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

/* The probe's figures at micro-batch b: interpolated, or extrapolated from the last two. */
static zr_probe_compute compute_at(const zr_probe *p, int b)
{
    const zr_probe_compute *c = p->compute;
    int n = p->ncompute, i = 0;
    while (i + 2 < n && c[i + 1].batch < b) {
        i++;
    }
    const zr_probe_compute *a = &c[i], *z = n > 1 ? &c[i + 1] : &c[i];
    zr_probe_compute r;
    r.batch = b;
    if (n == 1) {
        double k = (double)b / a->batch;
        r = *a;
        r.fwd_embed *= k, r.fwd_block *= k, r.fwd_head *= k;
        r.bwd_head *= k, r.bwd_block *= k, r.bwd_embed *= k;
        r.batch = b;
        return r;
    }
#define L(f) r.f = fmax(0, lerp(a->batch, a->f, z->batch, z->f, b))
    L(fwd_embed);
    L(fwd_block);
    L(fwd_head);
    L(bwd_head);
    L(bwd_block);
    L(bwd_embed);
#undef L
    return r;
}

/* ---- the entry points ------------------------------------------------------------ */

static zr_status check_choice(const zr_plan_choice *ch, int nodes, int D)
{
    if (nodes < 1 || D < 1) {
        ZR_FAIL(ZR_ERR_INVALID, "a layout needs at least one node and one rank per node, got %dx%d",
                nodes, D);
    }
    if (ch->stage < 0 || ch->stage > 3) {
        ZR_FAIL(ZR_ERR_INVALID, "stage must be 0..3, got %d", ch->stage);
    }
    if ((ch->qwz || ch->hpz != 1) && ch->stage != 3) {
        ZR_FAIL(ZR_ERR_INVALID, "qwZ and hpZ need stage 3 (got stage %d)", ch->stage);
    }
    if (ch->qgz && ch->stage < 2) {
        ZR_FAIL(ZR_ERR_INVALID, "qgZ needs stage 2 or 3 (got stage %d)", ch->stage);
    }
    if (ch->hpz == 0 && D != 1) {
        ZR_FAIL(ZR_ERR_INVALID,
                "hpZ 0 (a secondary over a group of one) needs one rank per node; "
                "with %d ranks per node the hpZ group is a divisor of %d",
                D, D);
    }
    if (ch->hpz < 0 || (ch->hpz > 0 && D % ch->hpz != 0)) {
        ZR_FAIL(ZR_ERR_INVALID, "the hpZ group (%d) must divide the ranks per node (%d)", ch->hpz,
                D);
    }
    if (ch->micro_batch < 1 || ch->accum < 1) {
        ZR_FAIL(ZR_ERR_INVALID, "micro-batch and accumulation must be >= 1, got %d and %d",
                ch->micro_batch, ch->accum);
    }
    return ZR_OK;
}

/*
 * Micro-batches are walked one by one up to WALK_EXACT of them. Beyond, the
 * engine runs the same schedule for every micro-batch after its first, so
 * once one leaves the transfers in flight exactly as it found them, every
 * later one adds exactly what it added: that is counted, not walked, and the
 * time of a plan does not grow with the accumulation (tests/test_plan.c
 * compares the count with the walk).
 */
enum { WALK_EXACT = 8 };

static int same_pending(const sim *s, const pending *before, int nbefore)
{
    return s->npend == nbefore && memcmp(s->pend, before, sizeof *before * (size_t)nbefore) == 0;
}

/* out += times * (out - before), field by field: the repeats of one micro-batch. */
static void repeat_micro(zr_plan_cost *out, const zr_plan_cost *before, double times)
{
    uint64_t n = (uint64_t)times;
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        zr_traffic_row *r = &out->traffic.kind[k];
        const zr_traffic_row *b = &before->traffic.kind[k];
        r->calls += n * (r->calls - b->calls);
        r->bytes_intra += n * (r->bytes_intra - b->bytes_intra);
        r->bytes_inter += n * (r->bytes_inter - b->bytes_inter);
    }
    out->t_compute += times * (out->t_compute - before->t_compute);
    out->t_codec += times * (out->t_codec - before->t_codec);
    out->t_comm += times * (out->t_comm - before->t_comm);
    out->t_exposed += times * (out->t_exposed - before->t_exposed);
    out->t_optim += times * (out->t_optim - before->t_optim);
}

/* accum micro-batches of one step: walked, or (see WALK_EXACT) walked until they repeat. */
static zr_status walk_micro(zr_engine *e, long long accum, sim *s, pending *snap)
{
    /* ZR_PLAN_WALK_ALL=1 (tests/test_plan.c): every micro-batch walked, to compare */
    const char *all = getenv("ZR_PLAN_WALK_ALL");
    int walk_all = s->waits != NULL || (all != NULL && strcmp(all, "1") == 0);
    long long a = 0;
    for (; a < accum && (a < WALK_EXACT || walk_all); a++) {
        ZR_CHECK(zr_gpt_engine_walk(e));
    }
    while (a < accum) {
        zr_plan_cost before = *s->out;
        int nbefore = s->npend;
        memcpy(snap, s->pend, sizeof *snap * (size_t)nbefore);
        ZR_CHECK(zr_gpt_engine_walk(e));
        a++;
        if (same_pending(s, snap, nbefore)) {
            repeat_micro(s->out, &before, (double)(accum - a));
            return ZR_OK;
        }
    }
    return ZR_OK;
}

/* The trainer's run, dry: parameters set, then three steps (see the caller). */
static zr_status walk(zr_engine *e, long long accum, sim *s)
{
    zr_plan_cost *out = s->out;
    pending *snap = NULL;
    ZR_ALLOC(snap, (size_t)s->maxpend);
    zr_status st = ZR_OK;
    for (int u = 0; u < e->nunits; u++) {
        /* stages 1-2 gather the working copy */
        ZR_CHECK_GOTO(zr_engine_set_params(e, u, NULL), st, done);
    }
    /* Three steps: the pool reuses the most recently used op first, so a later step can hand a
       small op a large collective and grow it; by the third the pool is what it stays. Time and
       bytes are the last step's (every step runs the same schedule). */
    for (int k = 0; k < 3; k++) {
        memset(out, 0, sizeof *out);
        s->nwaits = 0;
        ZR_CHECK_GOTO(walk_micro(e, accum, s, snap), st, done);
        zr_step_stats stats;
        ZR_CHECK_GOTO(zr_engine_step(e, 0.0f, &stats), st, done);
    }
done:
    zr_free(snap);
    return st;
}

/* Bytes, time and the pool's peak of the dry run; the caller has set s and out. */
static zr_status run_dry(sim *s, zr_comm *layout, const zr_engine_config *ecfg,
                         const zr_gpt_specs *sp, int accum, size_t *pool_peak)
{
    /* in flight at once: a gather and a reduction per unit, and a blocking refresh */
    s->maxpend = 2 * sp->nunits + 1;
    ZR_ALLOC(s->pend, (size_t)s->maxpend);
    zr_engine e;
    zr_engine_observer obs = {observe, s};
    zr_status st;
    ZR_CHECK_GOTO(zr_engine_init_dry(&e, layout, ecfg, sp->nunits, sp->units, obs), st, done);
    st = walk(&e, accum, s);
    *pool_peak = zr_engine_memory(&e).pool_peak;
    zr_engine_free(&e);
done:
    zr_free(s->pend);
    s->pend = NULL;
    return st;
}

zr_status zr_plan_cost_with(const zr_train_config *cfg, int vocab, int nodes, int D,
                            const zr_plan_choice *ch, const zr_probe *probe, const calib *cal,
                            double *waits, int maxwaits, int *nwaits, zr_plan_cost *out)
{
    memset(out, 0, sizeof *out);
    ZR_CHECK(check_choice(ch, nodes, D));
    zr_train_config c = *cfg;
    zr_plan_apply(&c, ch);
    zr_gpt_config m;
    ZR_CHECK(zr_plan_model(&c, vocab, &m));
    zr_comm layout;
    ZR_CHECK(zr_comm_init_layout(&layout, nodes, D, ch->hpz, 0));
    int gpu = probe != NULL && probe->gpu;
    /* a probe of GPUs: the CUDA backend's working type and memory */
    zr_engine_config ecfg = zr_config_engine(&c, gpu ? ZR_DTYPE_BF16 : ZR_DTYPE_F32);
    zr_gpt_specs sp;
    ZR_CHECK(zr_gpt_specs_init(&sp, &m));
    sim s;
    memset(&s, 0, sizeof s);
    s.p = probe;
    s.cal = *cal;
    s.last = sp.nunits - 1;
    s.out = out;
    s.waits = waits;
    s.maxwaits = maxwaits;
    if (probe != NULL) {
        s.pc = compute_at(probe, ch->micro_batch);
    }
    size_t pool_peak = 0;
    zr_status st = run_dry(&s, &layout, &ecfg, &sp, ch->accum, &pool_peak);
    zr_gpt_specs_free(&sp);
    ZR_CHECK(st);
    if (nwaits != NULL) {
        *nwaits = s.nwaits;
    }
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        out->bytes_intra += (double)out->traffic.kind[k].bytes_intra;
        out->bytes_inter += (double)out->traffic.kind[k].bytes_inter;
    }
    out->t_step = out->t_compute + out->t_codec + out->t_exposed + out->t_optim;
    double tokens = (double)layout.size[ZR_GROUP_WORLD] * ch->micro_batch * ch->accum * c.seq_len;
    out->tokens_per_s = out->t_step > 0 ? tokens / out->t_step : 0;
    ZR_CHECK(zr_gpt_engine_predict(&m, ch->micro_batch, c.seq_len, c.activation_checkpointing,
                                   &ecfg, &layout, &out->mem));
    if (gpu) {
        /* the device model in place of the CPU's activations (the trainer's GPU check) */
        zr_gpt_shape sh = {ch->micro_batch, c.seq_len, 0,
                           probe->bf16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32};
        size_t dev = zr_gpt_cuda_engine_bytes(&m, &sh, &ecfg);
        out->mem.total = out->mem.total - out->mem.activations + dev;
        out->mem.activations = dev;
    }
    /* the dry engine's pool peak, exact, in place of the engine's general bound */
    out->mem.total = out->mem.total - out->mem.pool + pool_peak;
    out->mem.pool = pool_peak;
    if (probe != NULL && probe->base_rss > 0) {
        out->mem.total = out->mem.total - out->mem.allowance + (size_t)probe->base_rss;
        out->mem.allowance = (size_t)probe->base_rss;
    }
    return ZR_OK;
}

zr_status zr_plan_cost_calibrated(const zr_train_config *cfg, int vocab, int nodes, int D,
                                  const zr_plan_choice *ch, const zr_probe *probe,
                                  const zr_plan_calibration *cal, zr_plan_cost *out)
{
    calib use = ch->stage == 3 ? cal->stage3 : cal->stage012;
    if (ch->stage == 0) {
        use.k_optim = cal->k_optim_replicated;
    }
    return zr_plan_cost_with(cfg, vocab, nodes, D, ch, probe, &use, NULL, 0, NULL, out);
}

zr_status zr_plan_cost_of(const zr_train_config *cfg, int vocab, int nodes, int D,
                          const zr_plan_choice *ch, const zr_probe *probe, zr_plan_cost *out)
{
    zr_plan_calibration cal;
    ZR_CHECK(zr_plan_calibrate(cfg, vocab, probe, &cal));
    return zr_plan_cost_calibrated(cfg, vocab, nodes, D, ch, probe, &cal, out);
}
