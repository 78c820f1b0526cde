/*
 * cost.c - the cost model: bytes, memory and step time of one configuration
 * on one layout, predicted before anything is allocated.
 *
 * Bytes are not estimated: the model walks the schedule the engine runs for
 * the GPT (zr_gpt_engine_micro: gather, prefetch, release, reduce, in that
 * order, with the same prefetch and reduction budgets and the same hpZ
 * secondary life cycle) and adds, for every collective, what each algorithm
 * of src/coll sends to peers on the same node and on other nodes:
 *
 *   exact all-gather / reduce-scatter over n ranks   count * wire bytes to each of n-1 peers
 *   qwZ / quantized hpZ gather                       one block of count elements to each peer
 *   hpZ gather                                       the secondary's slice, over the hpZ group
 *   qgZ                                              N blocks to each of D-1 node peers, then
 *                                                    one block to each of N-1 other nodes
 *   all-reduce (stage 0)                             reduce-scatter + all-gather of the parts
 *
 * so tests/test_plan.c can require equality with the engine's counters.
 *
 * Time walks the same schedule with the probe's figures: compute of each
 * unit (forward, backward), the CPU work of each collective (conversions,
 * quantization, sums: zr has no progress thread, so it is on the critical
 * path), and each transfer's time from its bytes and the measured bandwidth
 * and latency of its level. A transfer posted before computation (prefetch,
 * asynchronous reduction) advances during it at the probe's measured
 * overlap fraction; what is left when its rank waits is exposed. Transfers
 * complete in the order they were posted (one link per rank), so a wait also
 * exposes what was posted before it.
 */
#include "zr/plan.h"

#include "zr/config.h"

#include <math.h>
#include <string.h>

enum { MAXPEND = 64 };

typedef struct pending {
    int id; /* u: gather of unit u; nunits + u: reduction of unit u */
    double left;
} pending;

/* The engine's pool (engine.c): buffers reused by size, ops reused with their workspaces. */
typedef struct pbuf {
    size_t cap; /* floats */
    int busy;
} pbuf;

typedef struct pop {
    size_t work; /* bytes */
    int busy;
} pop;

typedef struct sim {
    const zr_probe *p; /* NULL: bytes and memory only */
    zr_probe_compute pc;
    zr_engine_config e;
    int W, N, D, h, nunits;
    size_t *padded; /* per unit */
    int *sec_valid, *gathered, *inflight, *prefetched, *from_primary, *reducing;
    size_t live, pre_el, red_el;
    int nred, *fifo, fifo_head;
    pending pend[MAXPEND];
    int npend;
    zr_comm layout; /* group sizes only, for the collectives' workspace sizes */
    pbuf *bufs;
    pop *ops;
    int nbufs, nops, maxpool;
    int *full, *gfull, *gtmp, *gop, *rop; /* per unit: pool indices, -1 = none */
    size_t pool_now, pool_peak;
    zr_plan_cost *out;
} sim;

/* ---- the pool, as engine.c runs it ---------------------------------------------- */

static void pool_account(sim *s)
{
    size_t now = 0;
    for (int i = 0; i < s->nbufs; i++) {
        now += s->bufs[i].cap * sizeof(float);
    }
    for (int i = 0; i < s->nops; i++) {
        now += s->ops[i].work;
    }
    s->pool_now = now;
    s->pool_peak = now > s->pool_peak ? now : s->pool_peak;
}

static int pool_get(sim *s, size_t n)
{
    int best = -1;
    for (int i = 0; i < s->nbufs; i++) {
        pbuf *b = &s->bufs[i];
        if (!b->busy && b->cap >= n && b->cap - n <= n / 8 &&
            (best < 0 || b->cap < s->bufs[best].cap)) {
            best = i;
        }
    }
    if (best < 0) {
        ZR_ASSERT(s->nbufs < s->maxpool);
        s->bufs[s->nbufs] = (pbuf){n, 0};
        best = s->nbufs++;
        pool_account(s);
    }
    s->bufs[best].busy = 1;
    return best;
}

static void pool_put(sim *s, int *i)
{
    if (*i >= 0) {
        s->bufs[*i].busy = 0;
        *i = -1;
    }
}

/* The most recently created idle op (engine.c: its workspace is warm). */
static int pool_get_op(sim *s)
{
    for (int i = s->nops - 1; i >= 0; i--) {
        if (!s->ops[i].busy) {
            s->ops[i].busy = 1;
            return i;
        }
    }
    ZR_ASSERT(s->nops < s->maxpool);
    s->ops[s->nops] = (pop){0, 1};
    return s->nops++;
}

/* A collective starts on op i: its workspace grows to what it needs (zr_coll_reserve). */
static void reserve(sim *s, int i, size_t bytes)
{
    if (bytes > s->ops[i].work) {
        s->ops[i].work = bytes;
    }
    pool_account(s);
}

static void pool_put_op(sim *s, int *i)
{
    if (*i >= 0) {
        pool_account(s);
        s->ops[*i].busy = 0;
        *i = -1;
    }
}

/* ---- transfers and their time ------------------------------------------------ */

static void count(sim *s, zr_kind k, double intra, double inter)
{
    s->out->traffic.kind[k].calls++;
    s->out->traffic.kind[k].bytes_intra += (uint64_t)intra;
    s->out->traffic.kind[k].bytes_inter += (uint64_t)inter;
}

/* Seconds of one exchange level: intra and inter bytes of this rank go out at once. */
static double level_time(const sim *s, double intra, double inter)
{
    if (s->p == NULL || (intra <= 0 && inter <= 0)) {
        return 0;
    }
    double ti = intra > 0 ? s->p->intra_lat + intra / s->p->intra_bw : 0;
    double te = inter > 0 ? s->p->inter_lat + inter / s->p->inter_bw : 0;
    return fmax(ti, te);
}

static void codec(sim *s, double seconds)
{
    s->out->t_codec += seconds;
}

static void post(sim *s, int id, double seconds)
{
    s->out->t_comm += seconds;
    ZR_ASSERT(s->npend < MAXPEND);
    s->pend[s->npend++] = (pending){id, seconds};
}

/* Wait for transfer id: it and everything posted before it are exposed. */
static void wait_for(sim *s, int id)
{
    int k = -1;
    for (int i = 0; i < s->npend; i++) {
        if (s->pend[i].id == id) {
            k = i;
        }
    }
    if (k < 0) {
        return;
    }
    for (int i = 0; i <= k; i++) {
        s->out->t_exposed += s->pend[i].left;
    }
    memmove(s->pend, s->pend + k + 1, sizeof(pending) * (size_t)(s->npend - k - 1));
    s->npend -= k + 1;
}

/* Computation of this many seconds: transfers in flight advance at the overlap fraction. */
static void compute(sim *s, double seconds)
{
    s->out->t_compute += seconds;
    double budget = s->p != NULL ? s->p->overlap * seconds : 0;
    for (int i = 0; i < s->npend && budget > 0; i++) {
        double d = fmin(budget, s->pend[i].left);
        s->pend[i].left -= d;
        budget -= d;
    }
}

/* ---- the collectives, as src/coll sends them ------------------------------- */

static double wire_bytes(zr_wire_type t)
{
    return t == ZR_WIRE_F32 ? 4 : 2;
}

static double qbytes(const zr_qparams *q, size_t n)
{
    return (double)zr_quant_block_bytes(q, n);
}

static double enc_rate(const sim *s, int bits)
{
    return s->p == NULL ? 0 : s->p->q_enc[bits == 8 ? 0 : 1];
}

static double dec_rate(const sim *s, int bits)
{
    return s->p == NULL ? 0 : s->p->q_dec[bits == 8 ? 0 : 1];
}

/* A per-element cost of the probe; 0 without one. */
#define RATE(s, field) ((s)->p != NULL ? (s)->p->field : 0.0)

/* A stage-3 gather of unit u: from the primary shards over the world, or the hpZ secondary. */
static void start_gather(sim *s, int u)
{
    size_t P = s->padded[u];
    int use_sec = s->e.hpz && s->sec_valid[u];
    double per, n, c;
    const zr_qparams *q = &s->e.qwz_q;
    if (s->full[u] < 0) {
        s->full[u] = pool_get(s, P);
    }
    s->gop[u] = pool_get_op(s);
    zr_wire qwire = {ZR_WIRE_QUANT, *q};
    const zr_wire *wire = s->e.qwz ? &qwire : &s->e.param_wire;
    zr_dtype sec_type = s->e.param_wire.type == ZR_WIRE_F32 ? ZR_DTYPE_F32 : ZR_DTYPE_BF16;
    reserve(s, s->gop[u],
            use_sec ? zr_allgather_work(&s->layout, ZR_GROUP_HPZ, wire, sec_type, P / (size_t)s->h)
                    : zr_allgather_work(&s->layout, ZR_GROUP_WORLD, wire, ZR_DTYPE_F32,
                                        P / (size_t)s->W));
    if (use_sec) {
        c = (double)(P / (size_t)s->h);
        n = s->h;
        per = s->e.qwz ? qbytes(q, P / (size_t)s->h) : c * wire_bytes(s->e.param_wire.type);
        count(s, ZR_KIND_HPZ, per * (n - 1), 0);
        post(s, u, level_time(s, per * (n - 1), 0));
    } else {
        c = (double)(P / (size_t)s->W);
        n = s->W;
        per = s->e.qwz ? qbytes(q, P / (size_t)s->W) : c * wire_bytes(s->e.param_wire.type);
        double intra = per * (s->D - 1), inter = per * (s->W - s->D);
        count(s, s->e.qwz ? ZR_KIND_QWZ : ZR_KIND_ALLGATHER, intra, inter);
        post(s, u, level_time(s, intra, inter));
    }
    if (s->e.qwz) {
        codec(s, c * enc_rate(s, q->bits) + n * c * dec_rate(s, q->bits));
    } else if (s->e.param_wire.type == ZR_WIRE_BF16) {
        codec(s, (use_sec ? 0 : c * RATE(s, bf16_enc)) + n * c * RATE(s, bf16_dec));
    }
    s->from_primary[u] = !use_sec;
    s->inflight[u] = 1;
    s->live += P;
}

static void wait_gather(sim *s, int u)
{
    wait_for(s, u);
    pool_put_op(s, &s->gop[u]);
    s->inflight[u] = 0;
    s->gathered[u] = 1;
    if (s->prefetched[u]) {
        s->prefetched[u] = 0;
        s->pre_el -= s->padded[u];
    }
}

static void prefetch(sim *s, int u)
{
    if (u < 0 || u >= s->nunits || s->e.stage != 3 || !s->e.overlap) {
        return;
    }
    size_t P = s->padded[u];
    if (s->gathered[u] || s->inflight[u] || s->live + P > s->e.max_live ||
        s->pre_el + P > s->e.prefetch_bucket) {
        return;
    }
    start_gather(s, u);
    s->prefetched[u] = 1;
    s->pre_el += P;
}

static void fetch(sim *s, int u)
{
    if (s->e.stage == 3 && !s->gathered[u]) {
        if (!s->inflight[u]) {
            start_gather(s, u);
        }
        wait_gather(s, u);
    }
}

static void release(sim *s, int u)
{
    if (s->e.stage != 3) {
        return;
    }
    if (s->inflight[u]) {
        wait_gather(s, u);
    }
    if (!s->gathered[u]) {
        return;
    }
    if (s->e.hpz && !s->sec_valid[u] && s->from_primary[u]) {
        codec(s, (double)(s->padded[u] / (size_t)s->h) * RATE(s, bf16_enc));
        s->sec_valid[u] = 1;
    }
    pool_put(s, &s->full[u]);
    s->gathered[u] = 0;
    s->live -= s->padded[u];
}

static void finish_oldest(sim *s)
{
    int u = s->fifo[s->fifo_head];
    s->fifo_head = (s->fifo_head + 1) % s->nunits;
    s->nred--;
    s->red_el -= s->padded[u];
    s->reducing[u] = 0;
    wait_for(s, s->nunits + u);
    pool_put_op(s, &s->rop[u]);
    if (s->e.stage >= 2) {
        codec(s, (double)(s->padded[u] / (size_t)s->W) * RATE(s, f32_add));
        pool_put(s, &s->gtmp[u]);
        pool_put(s, &s->gfull[u]);
    }
}

static void finish_grad(sim *s, int u)
{
    while (s->reducing[u]) {
        finish_oldest(s);
    }
}

/* The gradient reduction of unit u: reduce-scatter, qgZ, or (stage 0) all-reduce. */
static void start_reduction(sim *s, int u, int allreduce)
{
    while (s->nred > 0 && s->red_el + s->padded[u] > s->e.reduce_bucket) {
        finish_oldest(s);
    }
    s->rop[u] = pool_get_op(s);
    s->fifo[(s->fifo_head + s->nred) % s->nunits] = u;
    s->nred++;
    s->red_el += s->padded[u];
    s->reducing[u] = 1;
    size_t P = s->padded[u], S = P / (size_t)s->W;
    if (s->e.stage >= 2) {
        s->gtmp[u] = pool_get(s, S);
    }
    if (s->e.qgz && !allreduce) {
        reserve(s, s->rop[u], zr_qgz_work(&s->layout, &s->e.qgz_cfg, S));
    } else if (allreduce) {
        reserve(s, s->rop[u],
                zr_allreduce_work(&s->layout, ZR_GROUP_WORLD, s->e.grad_wire.type, P));
    } else {
        reserve(s, s->rop[u],
                zr_reduce_scatter_work(&s->layout, ZR_GROUP_WORLD, &s->e.grad_wire, S));
    }
    double c = (double)S, W = s->W, N = s->N, D = s->D;
    if (s->e.qgz && !allreduce) {
        const zr_qparams *q = &s->e.qgz_cfg.q;
        double B = qbytes(q, S), intra = D > 1 ? N * B * (D - 1) : 0,
               inter = N > 1 ? B * (N - 1) : 0;
        count(s, ZR_KIND_QGZ, intra, inter);
        post(s, s->nunits + u, level_time(s, intra, 0) + level_time(s, 0, inter));
        double enc = enc_rate(s, q->bits), dec = dec_rate(s, q->bits);
        if (D > 1) {
            codec(s, W * c * enc + D * N * c * dec + (N > 1 ? N * c * enc + N * c * dec : 0));
        } else {
            codec(s, N * c * enc + N * c * dec);
        }
        return;
    }
    double per = c * wire_bytes(s->e.grad_wire.type), mult = allreduce ? 2 : 1;
    double intra = mult * per * (D - 1), inter = mult * per * (W - D);
    count(s, allreduce ? ZR_KIND_ALLREDUCE : ZR_KIND_REDUCE_SCATTER, intra, inter);
    post(s, s->nunits + u, level_time(s, intra, inter));
    if (s->e.grad_wire.type == ZR_WIRE_BF16) {
        codec(s, W * c * (RATE(s, bf16_enc) + RATE(s, bf16_dec) + RATE(s, f32_add)) +
                     (allreduce ? c * RATE(s, bf16_enc) + W * c * RATE(s, bf16_dec) : 0));
    } else {
        codec(s, W * c * RATE(s, f32_add));
    }
}

/* ---- the schedule of zr_gpt_engine_micro and zr_engine_step ------------------ */

static void grads(sim *s, int u)
{
    finish_grad(s, u);
    if (s->e.stage >= 2 && s->gfull[u] < 0) {
        codec(s, (double)s->padded[u] * RATE(s, sumsq)); /* a zeroed pool buffer */
        s->gfull[u] = pool_get(s, s->padded[u]);
    }
}

static void grads_done(sim *s, int u)
{
    if (s->e.stage < 2) {
        return;
    }
    start_reduction(s, u, 0);
    if (!s->e.overlap) {
        finish_grad(s, u);
    }
}

static void micro(sim *s, int L)
{
    const zr_probe_compute *c = &s->pc;
    int last = L + 1;
    prefetch(s, 0);
    for (int u = 0; u < last; u++) {
        fetch(s, u);
        prefetch(s, u + 1);
        compute(s, u == 0 ? c->fwd_embed : c->fwd_block);
        release(s, u);
    }
    prefetch(s, 0);
    fetch(s, last);
    fetch(s, 0);
    compute(s, c->fwd_head);
    grads(s, last);
    grads(s, 0);
    prefetch(s, last - 1);
    compute(s, c->bwd_head);
    release(s, last);
    release(s, 0);
    grads_done(s, last);
    for (int u = last - 1; u >= 1; u--) {
        fetch(s, u);
        prefetch(s, u - 1 >= 1 ? u - 1 : -1);
        grads(s, u);
        compute(s, c->bwd_block);
        release(s, u);
        grads_done(s, u);
    }
    compute(s, c->bwd_embed);
    grads_done(s, 0);
}

/* The blocking all-gather that refreshes a stage 1-2 working copy takes a pooled op. */
static void refresh_op(sim *s, int u)
{
    int op = pool_get_op(s);
    reserve(s, op,
            zr_allgather_work(&s->layout, ZR_GROUP_WORLD, &s->e.param_wire, ZR_DTYPE_F32,
                              s->padded[u] / (size_t)s->W));
    pool_put_op(s, &op);
}

static void step(sim *s)
{
    int stage = s->e.stage;
    if (stage < 2) {
        for (int u = 0; u < s->nunits; u++) {
            start_reduction(s, u, stage == 0);
        }
    }
    while (s->nred > 0) {
        finish_oldest(s);
    }
    double upd = 0, clear = 0;
    for (int u = 0; u < s->nunits; u++) {
        double P = (double)s->padded[u], S = P / s->W;
        upd += stage == 0 ? P : S;
        clear += stage >= 2 ? S : P;
        s->out->t_optim += S * RATE(s, sumsq);
    }
    s->out->t_optim += upd * RATE(s, adamw) + clear * RATE(s, sumsq);
    for (int u = 0; u < s->nunits; u++) {
        s->sec_valid[u] = 0; /* the step invalidates every hpZ secondary */
    }
    if (stage == 1 || stage == 2) {
        /* the working copy is refreshed from the new shards, blocking */
        for (int u = 0; u < s->nunits; u++) {
            double c = (double)(s->padded[u] / (size_t)s->W);
            double per = c * wire_bytes(s->e.param_wire.type);
            refresh_op(s, u);
            count(s, ZR_KIND_ALLGATHER, per * (s->D - 1), per * (s->W - s->D));
            post(s, u, level_time(s, per * (s->D - 1), per * (s->W - s->D)));
            wait_for(s, u);
            if (s->e.param_wire.type == ZR_WIRE_BF16) {
                codec(s, c * RATE(s, bf16_enc) + s->W * c * RATE(s, bf16_dec));
            }
        }
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

void zr_plan_apply(zr_train_config *cfg, const zr_plan_choice *ch)
{
    cfg->stage = ch->stage;
    cfg->zero_quantized_weights = ch->qwz;
    if (ch->qwz_bits > 0) {
        cfg->qwz_bits = ch->qwz_bits;
    }
    cfg->zero_hpz_partition_size = ch->hpz;
    cfg->zero_quantized_gradients = ch->qgz;
    if (ch->qgz_bits > 0) {
        cfg->qgz_bits = ch->qgz_bits;
    }
    cfg->stage3_prefetch_bucket_size = ch->prefetch_bucket;
    cfg->train_micro_batch_size_per_gpu = ch->micro_batch;
    cfg->gradient_accumulation_steps = ch->accum;
    cfg->train_batch_size = 0;
    cfg->given |=
        ZR_GIVEN_QWZ | ZR_GIVEN_HPZ | ZR_GIVEN_QGZ | ZR_GIVEN_MICRO_BATCH | ZR_GIVEN_GRAD_ACCUM;
    cfg->given &= ~ZR_GIVEN_TRAIN_BATCH;
}

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

zr_status zr_plan_cost_of(const zr_train_config *cfg, int vocab, int nodes, int D,
                          const zr_plan_choice *ch, const zr_probe *probe, zr_plan_cost *out)
{
    memset(out, 0, sizeof *out);
    ZR_CHECK(check_choice(ch, nodes, D));
    zr_train_config c = *cfg;
    zr_plan_apply(&c, ch);
    zr_gpt_config m = {c.max_seq_len, vocab,   (int)zr_round_up((size_t)vocab, 128),
                       c.layers,      c.heads, c.channels};
    zr_gpt_specs sp;
    ZR_CHECK(zr_gpt_specs_init(&sp, &m));
    sim s;
    memset(&s, 0, sizeof s);
    s.p = probe;
    s.e = zr_config_engine(&c);
    s.W = nodes * D, s.N = nodes, s.D = D, s.h = ch->hpz > 0 ? ch->hpz : 1, s.nunits = sp.nunits;
    s.out = out;
    zr_status st = ZR_OK;
    size_t *mem = NULL;
    size_t n = (size_t)s.nunits;
    s.maxpool = 8 * s.nunits + 16;
    size_t words = n + 12 * n + 2 * (size_t)s.maxpool * 2; /* size_t words, generously */
    st = zr_alloc_at((void **)&mem, words * sizeof(size_t), __FILE__, __LINE__);
    if (st != ZR_OK) {
        goto fail;
    }
    s.padded = mem;
    int *flags = (int *)(mem + n);
    s.sec_valid = flags, s.gathered = flags + n, s.inflight = flags + 2 * n;
    s.prefetched = flags + 3 * n, s.from_primary = flags + 4 * n, s.reducing = flags + 5 * n;
    s.fifo = flags + 6 * n, s.full = flags + 7 * n, s.gfull = flags + 8 * n;
    s.gtmp = flags + 9 * n, s.gop = flags + 10 * n, s.rop = flags + 11 * n;
    for (size_t i = 7 * n; i < 12 * n; i++) {
        flags[i] = -1;
    }
    s.bufs = (pbuf *)(mem + 7 * n);
    s.ops = (pop *)(s.bufs + s.maxpool);
    s.layout.size[ZR_GROUP_WORLD] = s.W;
    s.layout.size[ZR_GROUP_NODE] = D;
    s.layout.size[ZR_GROUP_CROSS] = nodes;
    s.layout.size[ZR_GROUP_HPZ] = s.h;
    s.layout.ranks_per_node = D;
    s.layout.n_nodes = nodes;
    for (int u = 0; u < s.nunits; u++) {
        s.padded[u] = zr_zero_padded(sp.units[u].numel, s.W);
    }
    if (s.e.stage == 1 || s.e.stage == 2) {
        for (int u = 0; u < s.nunits; u++) {
            refresh_op(&s, u); /* zr_engine_set_params gathers the working copy once */
        }
    }
    if (probe != NULL) {
        s.pc = compute_at(probe, ch->micro_batch);
    }
    /* Three steps: the pool reuses the most recently used op first, so a later step can hand a
       small op a large collective and grow it; by the third the pool is what it stays. Time and
       bytes are the last step's (every step runs the same schedule). */
    for (int k = 0; k < 3; k++) {
        memset(out, 0, sizeof *out);
        for (int a = 0; a < ch->accum; a++) {
            micro(&s, c.layers);
        }
        step(&s);
    }
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        out->bytes_intra += (double)out->traffic.kind[k].bytes_intra;
        out->bytes_inter += (double)out->traffic.kind[k].bytes_inter;
    }
    out->t_step = out->t_compute + out->t_codec + out->t_exposed + out->t_optim;
    out->tokens_per_s =
        out->t_step > 0 ? (double)s.W * ch->micro_batch * ch->accum * c.seq_len / out->t_step : 0;
    st = zr_gpt_engine_predict(&m, ch->micro_batch, c.seq_len, c.activation_checkpointing, &s.e,
                               &s.layout, &out->mem);
    if (st == ZR_OK) {
        /* the schedule's own pool peak, exact, in place of the engine's general bound */
        out->mem.total = out->mem.total - out->mem.pool + s.pool_peak;
        out->mem.pool = s.pool_peak;
    }
    if (st == ZR_OK && probe != NULL && probe->base_rss > 0) {
        out->mem.total = out->mem.total - out->mem.allowance + (size_t)probe->base_rss;
        out->mem.allowance = (size_t)probe->base_rss;
    }
fail:
    zr_free(mem);
    zr_gpt_specs_free(&sp);
    return st;
}
