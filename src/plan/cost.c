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
 * Calibration (the probe's reference steps, probe_ref.c): the rates above
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
#include "zr/plan.h"

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

static const calib no_calib = {1, 0, 1, 1, 0};

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

/* The trainer's run, dry: parameters set, then three steps (see the caller). */
static zr_status walk(zr_engine *e, int accum, sim *s)
{
    zr_plan_cost *out = s->out;
    for (int u = 0; u < e->nunits; u++) {
        ZR_CHECK(zr_engine_set_params(e, u, NULL)); /* stages 1-2 gather the working copy */
    }
    /* Three steps: the pool reuses the most recently used op first, so a later step can hand a
       small op a large collective and grow it; by the third the pool is what it stays. Time and
       bytes are the last step's (every step runs the same schedule). */
    for (int k = 0; k < 3; k++) {
        memset(out, 0, sizeof *out);
        s->nwaits = 0;
        for (int a = 0; a < accum; a++) {
            ZR_CHECK(zr_gpt_engine_walk(e));
        }
        zr_step_stats stats;
        ZR_CHECK(zr_engine_step(e, 0.0f, &stats));
    }
    return ZR_OK;
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

/* The cost of ch with calibration cal; waits (maxwaits of them) non-NULL: the step's waits too. */
static zr_status cost_with(const zr_train_config *cfg, int vocab, int nodes, int D,
                           const zr_plan_choice *ch, const zr_probe *probe, const calib *cal,
                           double *waits, int maxwaits, int *nwaits, zr_plan_cost *out)
{
    memset(out, 0, sizeof *out);
    ZR_CHECK(check_choice(ch, nodes, D));
    zr_train_config c = *cfg;
    zr_plan_apply(&c, ch);
    zr_gpt_config m = {c.max_seq_len, vocab,   (int)zr_round_up((size_t)vocab, 128),
                       c.layers,      c.heads, c.channels};
    zr_comm layout;
    ZR_CHECK(zr_comm_init_layout(&layout, nodes, D, ch->hpz, 0));
    int gpu = probe != NULL && probe->gpu;
    zr_engine_config ecfg = zr_config_engine(&c, gpu);
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
        size_t dev = zr_gpt_gpu_device_bytes(&m, ch->micro_batch, c.seq_len,
                                             probe->bf16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32, &ecfg);
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

/* ---- calibration on the probe's reference steps ---------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The least t with sum over w of max(w_i, t) = target (w sorted); 0 if the waits reach it alone. */
static double sync_floor(const double *w, int n, double target)
{
    double suffix = 0;
    for (int i = 0; i < n; i++) {
        suffix += w[i];
    }
    if (n == 0 || target <= suffix) {
        return 0;
    }
    /* with j waits below t: j t + (the rest) = target */
    for (int j = 1; j <= n; j++) {
        suffix -= w[j - 1];
        double t = (target - suffix) / j;
        if (t >= w[j - 1] && (j == n || t <= w[j])) {
            return t;
        }
    }
    return target / n; /* not reached: with j = n the floor always fits */
}

enum { MAX_WAITS = 1 << 14, NREF = 3 };

/* What references lo..hi-1 priced with f at no floor leave: per reference, the exposure its step
   measured (target) and the priced one, and its synchronising waits (nw of them, in w after the
   earlier references'). */
typedef struct ref_waits {
    double target[NREF], exposed[NREF];
    int nw[NREF], n; /* n: all of them */
} ref_waits;

static zr_status price_refs(const zr_train_config *cfg, int vocab, const zr_probe *p, int lo,
                            int hi, const calib *f, double k_optim_replicated, double *w,
                            ref_waits *rw)
{
    memset(rw, 0, sizeof *rw);
    for (int i = lo; i < hi; i++) {
        zr_plan_choice ref = zr_probe_reference(i, p->cal_batch, (long long)p->cal_prefetch);
        calib use = *f;
        use.t_sync = 0;
        if (i == 2) {
            use.k_optim = k_optim_replicated;
        }
        zr_plan_cost r;
        ZR_CHECK(cost_with(cfg, vocab, p->nodes, p->ranks_per_node, &ref, p, &use, w + rw->n,
                           NREF * MAX_WAITS - rw->n, &rw->nw[i], &r));
        rw->n += rw->nw[i];
        rw->target[i] = p->cal_step[i] - r.t_compute - r.t_codec - r.t_optim;
        rw->exposed[i] = r.t_exposed;
    }
    return ZR_OK;
}

/* The floor per wait that makes the pooled exposure of lo..hi-1 their pooled target; 0 where
   they waited less than priced at no floor. Sorts w (a copy: the caller's keeps its order). */
static double pooled_floor(const ref_waits *rw, int lo, int hi, const double *w, double *sorted)
{
    double target = 0, exposed = 0, sync = 0;
    for (int i = lo; i < hi; i++) {
        target += rw->target[i], exposed += rw->exposed[i];
    }
    if (target < exposed) {
        return 0;
    }
    for (int i = 0; i < rw->n; i++) {
        sync += w[i];
        sorted[i] = w[i];
    }
    qsort(sorted, (size_t)rw->n, sizeof *sorted, cmp_double);
    return sync_floor(sorted, rw->n, target - (exposed - sync));
}

/* The waits of one reference (stage 0's), with the computation already calibrated in f: a floor
   per wait where it waited longer than its transfers say; a scale on them where it waited less,
   by bisection (the overlap hides a scaled transfer more than in proportion). */
static zr_status fit_waits_one(const zr_train_config *cfg, int vocab, const zr_probe *p, int r,
                               double k_optim_replicated, double *w, calib *f)
{
    ref_waits rw;
    f->k_comm = 1, f->t_sync = 0;
    ZR_CHECK(price_refs(cfg, vocab, p, r, r + 1, f, k_optim_replicated, w, &rw));
    if (rw.target[r] >= rw.exposed[r]) {
        f->t_sync = pooled_floor(&rw, r, r + 1, w, w + rw.n);
        return ZR_OK;
    }
    /* exposure grows with the scale: exposed(lo_k) <= target < exposed(hi_k) */
    double lo_k = 0.1, hi_k = 1;
    f->k_comm = lo_k;
    ZR_CHECK(price_refs(cfg, vocab, p, r, r + 1, f, k_optim_replicated, w, &rw));
    if (rw.exposed[r] >= rw.target[r]) {
        return ZR_OK; /* the transfers hide ten times better than measured: no further */
    }
    for (int it = 0; it < 40 && hi_k - lo_k > 1e-12; it++) {
        f->k_comm = 0.5 * (lo_k + hi_k);
        ZR_CHECK(price_refs(cfg, vocab, p, r, r + 1, f, k_optim_replicated, w, &rw));
        if (rw.exposed[r] > rw.target[r]) {
            hi_k = f->k_comm;
        } else {
            lo_k = f->k_comm;
        }
    }
    return ZR_OK;
}

/* The two stage 3 references with transfers scaled by k (set in f): the floor that fits their
   pooled exposure (set in f; 0 where they waited less than priced at no floor, *over then the
   pooled excess) and how far ZeRO-3's exposure lands from what it measured (*r0). */
static zr_status pair_at(const zr_train_config *cfg, int vocab, const zr_probe *p, double k,
                         double *w, calib *f, double *r0, double *over)
{
    ref_waits rw;
    f->k_comm = k, f->t_sync = 0;
    ZR_CHECK(price_refs(cfg, vocab, p, 0, 2, f, 1, w, &rw));
    f->t_sync = pooled_floor(&rw, 0, 2, w, w + rw.n);
    double e = rw.exposed[0];
    for (int j = 0; j < rw.nw[0]; j++) {
        e += fmax(w[j], f->t_sync) - w[j];
    }
    *r0 = e - rw.target[0];
    *over = rw.exposed[0] + rw.exposed[1] - rw.target[0] - rw.target[1];
    return ZR_OK;
}

/* The largest scale in a..b (to 1e-12) at which pair_at's *over (which 0) or *r0 (which 1) is
   not positive, given that it is not at a and is at b: both grow with the scale. */
static zr_status pair_bisect(const zr_train_config *cfg, int vocab, const zr_probe *p, double *w,
                             calib *f, int which, double a, double b, double *k)
{
    for (int it = 0; it < 60 && b - a > 1e-12 * b; it++) {
        double m = 0.5 * (a + b), r0, over;
        ZR_CHECK(pair_at(cfg, vocab, p, m, w, f, &r0, &over));
        if ((which ? r0 : over) > 0) {
            b = m;
        } else {
            a = m;
        }
    }
    *k = a;
    return ZR_OK;
}

/*
 * Stage 3's waits from its two references, with the computation already
 * calibrated in f: the scale on the transfers (k_comm) and floor per wait
 * (t_sync) that land both steps where they measured. One figure cannot: a
 * floor adds alike to steps whose bytes differ by half, a scale in proportion
 * to their bytes (on bench/cluster's runs, replayed, the pair took the mean
 * error from 0.088 to 0.083). Each scale's floor fits the pooled exposure,
 * exactly up to the scale k_x where the transfers alone reach it; within
 * 0.1..k_x ZeRO-3's share grows with the scale, and bisection finds the one
 * that leaves it exact too, or the nearer end (k_x: no floor).
 */
static zr_status fit_waits_pair(const zr_train_config *cfg, int vocab, const zr_probe *p, double *w,
                                calib *f)
{
    const double k_lo = 0.1, k_hi = 10;
    double r_lo, r_hi, over, k_x = k_hi, k;
    ZR_CHECK(pair_at(cfg, vocab, p, k_lo, w, f, &r_lo, &over));
    if (over >= 0) {
        return ZR_OK; /* the transfers hide ten times better than measured: no further */
    }
    ZR_CHECK(pair_at(cfg, vocab, p, k_hi, w, f, &r_hi, &over));
    if (over > 0) {
        ZR_CHECK(pair_bisect(cfg, vocab, p, w, f, 0, k_lo, k_hi, &k_x));
        ZR_CHECK(pair_at(cfg, vocab, p, k_x, w, f, &r_hi, &over));
    }
    /* within k_lo..k_x the pooled exposure is exact; ZeRO-3's residual grows with the scale */
    if (r_lo >= 0 || r_hi <= 0) {
        k = r_lo >= 0 ? k_lo : k_x;
    } else {
        ZR_CHECK(pair_bisect(cfg, vocab, p, w, f, 1, k_lo, k_x, &k));
    }
    return pair_at(cfg, vocab, p, k, w, f, &r_lo, &over); /* leaves k and its floor in f */
}

/* The computation's factors from the two stage 3 references: k busy_i + c bytes_i = measured_i. */
static void fit_compute(const zr_probe *p, const zr_plan_cost *r, calib *f)
{
    double b0 = r[0].t_compute + r[0].t_codec, b1 = r[1].t_compute + r[1].t_codec;
    double y0 = r[0].bytes_inter, y1 = r[1].bytes_inter;
    double m0 = p->cal_compute[0], m1 = p->cal_compute[1];
    double det = b0 * y1 - b1 * y0, k = 0, c = -1;
    if (!p->gpu && fabs(det) > 1e-9 * (b0 * y1 + b1 * y0)) {
        k = (m0 * y1 - m1 * y0) / det;
        c = (b0 * m1 - b1 * m0) / det;
    }
    if (!(k > 0 && c >= 0)) {
        /* the bytes explain nothing (one node, or a difference within the noise) */
        c = 0;
        k = b0 + b1 > 0 ? (m0 + m1) / (b0 + b1) : 1;
    }
    f->k_compute = k, f->c_byte = c;
    double o = r[0].t_optim + r[1].t_optim;
    f->k_optim = o > 0 ? (p->cal_optim[0] + p->cal_optim[1]) / o : 1;
}

zr_status zr_plan_calibrate(const zr_train_config *cfg, int vocab, const zr_probe *p,
                            zr_plan_calibration *out)
{
    out->stage3 = out->stage012 = no_calib;
    out->k_optim_replicated = 1;
    out->calibrated = p != NULL && p->cal_batch > 0;
    if (!out->calibrated) {
        return ZR_OK;
    }
    int nref = p->cal_step[2] > 0 ? 3 : 2; /* the stage 0 reference may not have fitted */
    zr_plan_cost r[NREF];
    for (int i = 0; i < nref; i++) {
        zr_plan_choice ref = zr_probe_reference(i, p->cal_batch, (long long)p->cal_prefetch);
        ZR_CHECK(cost_with(cfg, vocab, p->nodes, p->ranks_per_node, &ref, p, &no_calib, NULL, 0,
                           NULL, &r[i]));
    }
    fit_compute(p, r, &out->stage3);
    double kr = out->stage3.k_optim;
    if (nref == 3 && r[2].t_optim > 0) {
        kr = p->cal_optim[2] / r[2].t_optim;
    }
    out->k_optim_replicated = kr; /* stages 1 and 2 shard the optimizer as stage 3 does */
    double *w = NULL;
    ZR_ALLOC(w, 2 * NREF * (size_t)MAX_WAITS); /* the waits, and a sorted copy */
    /* stage 3's waits on both ZeRO-3 references; stages 0-2 reduce at the step what stage 3
       reduces during backward: theirs on stage 0's reference, where it ran; none where nothing
       is sent (one rank) */
    zr_status st = r[0].t_comm > 0 ? fit_waits_pair(cfg, vocab, p, w, &out->stage3) : ZR_OK;
    out->stage012 = out->stage3;
    if (st == ZR_OK && nref == 3 && r[2].t_comm > 0) {
        st = fit_waits_one(cfg, vocab, p, 2, kr, w, &out->stage012);
    }
    zr_free(w);
    return st;
}

zr_status zr_plan_cost_calibrated(const zr_train_config *cfg, int vocab, int nodes, int D,
                                  const zr_plan_choice *ch, const zr_probe *probe,
                                  const zr_plan_calibration *cal, zr_plan_cost *out)
{
    calib use = ch->stage == 3 ? cal->stage3 : cal->stage012;
    if (ch->stage == 0) {
        use.k_optim = cal->k_optim_replicated;
    }
    return cost_with(cfg, vocab, nodes, D, ch, probe, &use, NULL, 0, NULL, out);
}

zr_status zr_plan_cost_of(const zr_train_config *cfg, int vocab, int nodes, int D,
                          const zr_plan_choice *ch, const zr_probe *probe, zr_plan_cost *out)
{
    zr_plan_calibration cal;
    ZR_CHECK(zr_plan_calibrate(cfg, vocab, probe, &cal));
    return zr_plan_cost_calibrated(cfg, vocab, nodes, D, ch, probe, &cal, out);
}
