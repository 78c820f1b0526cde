/*
 * test_plan.c - the cost model and the planner (src/plan).
 *
 *   bytes      for every stage and ZeRO++ combination the layout allows, with
 *              and without accumulation, prefetch and qgZ chunks, the bytes
 *              and exchanges of each collective kind the model predicts for
 *              one step (from its dry engine) equal, on every rank, what the
 *              engine's counters count while the trainer runs that step; the
 *              model state equals the engine's accounting and the pool's
 *              peak equals the engine's
 *   by hand    ZeRO-3 bf16 inter-node bytes and the step time of a made-up
 *              probe, computed here from first principles
 *   probe      zr_probe_run on this layout, written and read back equal;
 *              damaged files refused naming the file and the key
 *   planner    a slow link picks quantized ZeRO++, a free link and costly
 *              codecs pick none; impossible requests are refused clearly
 *   bounded    peers counted, not visited (equal at every small layout);
 *              micro-batches beyond 8 counted, not walked (equal costs);
 *              2^24 and 10^6 ranks and 2^20 micro-batches planned, in
 *              memory that does not grow with them; more ranks, a deeper
 *              or wider probe refused naming the key
 *   --gpu      (the emulated GPU, or a real one) the probe on GPUs: its
 *              figures and reference steps, the GPU's memory, the plan
 *              calibrated on them, the device model's bytes in the
 *              plan's memory; a GPU run's counters and memory equal the
 *              plan's, in fp32 and in bf16 compute (the engine's bf16
 *              working buffers); a plan for the other device or compute
 *              type refused
 *
 * Runs under mpirun at several layouts (tests/testlist).
 */
#define _POSIX_C_SOURCE 200809L
#define ZR_TEST_MPI
#include "test.h"

#include "zr/plan.h"
#include "zr/trainer.h"

#include <unistd.h>

static int W, R;

static void tiny(zr_train_config *c)
{
    zr_config_defaults(c);
    c->layers = 2;
    c->channels = 64;
    c->heads = 4;
    c->seq_len = 16;
    c->max_seq_len = 16;
    c->train_micro_batch_size_per_gpu = 1;
    c->gradient_accumulation_steps = 1;
    c->train_batch_size = 0;
    c->train_steps = 4;
    c->val_every = 0;
    c->steps_per_print = 100;
    c->scheduler_type[0] = '\0';
    c->threads = 1;
    c->reduce_bucket_size = 3000; /* a few units in flight: the budget logic matters */
    snprintf(c->device, sizeof c->device, "cpu");
}

/* One step's bytes per kind through the trainer, on this rank. */
static void measure(const zr_train_config *base, const zr_plan_choice *ch, zr_traffic *out,
                    zr_memory *mem, int *nodes, int *D)
{
    static zr_train_config cfg;
    cfg = *base;
    zr_plan_apply(&cfg, ch);
    TEST_OK(zr_config_finalize(&cfg, W));
    static zr_trainer t;
    TEST_OK(zr_trainer_init(&t, MPI_COMM_WORLD, &cfg, NULL, NULL));
    zr_step_record rec;
    TEST_OK(zr_trainer_step(&t, &rec)); /* the first steps warm the pools */
    TEST_OK(zr_trainer_step(&t, &rec));
    zr_traffic a = zr_comm_traffic_get(&t.comm);
    TEST_OK(zr_trainer_step(&t, &rec));
    zr_traffic b = zr_comm_traffic_get(&t.comm);
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        out->kind[k].calls = b.kind[k].calls - a.kind[k].calls;
        out->kind[k].bytes_intra = b.kind[k].bytes_intra - a.kind[k].bytes_intra;
        out->kind[k].bytes_inter = b.kind[k].bytes_inter - a.kind[k].bytes_inter;
    }
    *mem = zr_engine_memory(&t.engine);
    *nodes = t.comm.n_nodes;
    *D = t.comm.ranks_per_node;
    TEST_OK(zr_trainer_conclude(&t, ZR_OK));
    zr_trainer_free(&t, 0);
}

/* The engine's bytes, state and pool peak for one choice against the plan's (with probe, if any).
 */
static void check_choice(const zr_train_config *base, const zr_plan_choice *ch,
                         const zr_probe *probe)
{
    zr_traffic got;
    zr_memory mem;
    int N = 0, D = 0;
    measure(base, ch, &got, &mem, &N, &D);
    zr_plan_cost cost;
    TEST_OK(zr_plan_cost_of(base, 256, N, D, ch, probe, &cost));
    char d[160];
    zr_plan_describe(ch, d, sizeof d);
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        if (k == ZR_KIND_CONTROL) {
            continue; /* norms and losses: not the plan's business */
        }
        TEST_CHECKF(got.kind[k].bytes_intra == cost.traffic.kind[k].bytes_intra &&
                        got.kind[k].bytes_inter == cost.traffic.kind[k].bytes_inter &&
                        got.kind[k].calls == cost.traffic.kind[k].calls,
                    "%s, %s: engine intra %llu inter %llu in %llu exchanges, plan intra %llu inter "
                    "%llu in %llu",
                    d, zr_kind_name((zr_kind)k), (unsigned long long)got.kind[k].bytes_intra,
                    (unsigned long long)got.kind[k].bytes_inter,
                    (unsigned long long)got.kind[k].calls,
                    (unsigned long long)cost.traffic.kind[k].bytes_intra,
                    (unsigned long long)cost.traffic.kind[k].bytes_inter,
                    (unsigned long long)cost.traffic.kind[k].calls);
    }
    double sum = 0;
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        sum += (double)got.kind[k].bytes_intra + (double)got.kind[k].bytes_inter;
    }
    TEST_CHECKF(W == 1 || sum > 0, "%s: the engine counted no bytes", d);
    size_t state = mem.params + mem.grads + mem.optim + mem.secondary;
    TEST_CHECKF(state == cost.mem.state, "%s: engine state %zu, plan %zu", d, state,
                cost.mem.state);
    TEST_CHECKF(mem.pool_peak == cost.mem.pool, "%s: engine pool peak %zu, plan %zu", d,
                mem.pool_peak, cost.mem.pool);
}

static void test_bytes_match_engine(void)
{
    zr_train_config base;
    tiny(&base);
    int D = 1;
    {
        zr_comm c;
        TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
        D = c.ranks_per_node;
        zr_comm_free(&c);
    }
    int hpz = D > 1 ? D : 0; /* one rank per node: a secondary over a group of one */
    const zr_plan_choice list[] = {
        {0, 0, 0, 1, 0, 0, 0, 1, 1},          {1, 0, 0, 1, 0, 0, 0, 1, 2},
        {2, 0, 0, 1, 0, 0, 0, 2, 1},          {2, 0, 0, 1, 1, 4, 0, 1, 2},
        {3, 0, 0, 1, 0, 0, 50000000, 1, 1},   {3, 0, 0, 1, 0, 0, 0, 1, 2},
        {3, 1, 8, 1, 0, 0, 50000000, 1, 1},   {3, 1, 4, 1, 0, 0, 3000, 1, 1},
        {3, 0, 0, hpz, 0, 0, 50000000, 1, 2}, {3, 0, 0, 1, 1, 4, 50000000, 1, 1},
        {3, 1, 8, hpz, 1, 4, 50000000, 1, 2}, {3, 1, 8, hpz, 1, 8, 0, 2, 1},
    };
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        check_choice(&base, &list[i], NULL);
    }
    /* qgZ pipelined in chunks: each chunk's blocks carry their own headers and scales */
    base.qgz_chunks = 3;
    check_choice(&base, &list[9], NULL);
    check_choice(&base, &list[10], NULL);
    base.qgz_chunks = 1;
    /* the shape of bench/cluster with the default buckets: several reductions in flight, and
       ops that a later step hands a bigger collective (the pool grows in the second step) */
    base.layers = 4, base.channels = 256, base.heads = 4, base.seq_len = 8, base.max_seq_len = 8;
    base.reduce_bucket_size = 1700000;
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i += 3) {
        check_choice(&base, &list[i], NULL);
    }
}

/* Two calibrations with the same factors. */
static int same_calib(const zr_plan_calibration *a, const zr_plan_calibration *b)
{
    const zr_plan_calib *x[2] = {&a->stage3, &a->stage012}, *y[2] = {&b->stage3, &b->stage012};
    int same = a->calibrated == b->calibrated && a->k_optim_replicated == b->k_optim_replicated;
    for (int i = 0; i < 2; i++) {
        same = same && x[i]->k_compute == y[i]->k_compute && x[i]->c_byte == y[i]->c_byte &&
               x[i]->k_optim == y[i]->k_optim && x[i]->k_comm == y[i]->k_comm &&
               x[i]->t_sync == y[i]->t_sync;
    }
    return same;
}

/* A probe with round numbers, for cases computed by hand. */
static zr_probe made_up(int nodes, int D)
{
    zr_probe p;
    memset(&p, 0, sizeof p);
    p.version = ZR_PROBE_VERSION;
    p.world = nodes * D, p.nodes = nodes, p.ranks_per_node = D, p.threads = 1;
    p.layers = 2, p.heads = 4, p.channels = 64, p.vocab = 256, p.padded_vocab = 256;
    p.seq_len = 16, p.max_seq_len = 16;
    p.ncompute = 1;
    p.compute[0] = (zr_probe_compute){1, 1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3};
    p.intra_bw = 1e10, p.inter_bw = 1e8, p.intra_lat = 1e-5, p.inter_lat = 1e-4;
    p.overlap = 0;
    p.mem_per_rank = 1e9;
    return p;
}

static void test_by_hand(void)
{
    zr_train_config c;
    tiny(&c);
    zr_gpt_config m = {16, 256, 256, 2, 4, 64};
    int N = 2, D = 2, Wh = 4;
    size_t S[4];
    for (int u = 0; u < 4; u++) {
        S[u] = zr_zero_padded(zr_gpt_config_unit_numel(&m, u), Wh) / (size_t)Wh;
    }
    /* ZeRO-3 bf16, no prefetch: unit 0 gathered twice (embedding, LM head), the
       blocks twice (forward, backward), the final LayerNorm once; every unit's
       gradient reduced once; each sends 2 bytes x S to each of W - D = 2 peers
       on the other node */
    double gathers = 2.0 * S[0] + 2.0 * S[1] + 2.0 * S[2] + S[3];
    double reduces = (double)(S[0] + S[1] + S[2] + S[3]);
    zr_plan_choice z3 = {3, 0, 0, 1, 0, 0, 0, 1, 1};
    zr_probe p = made_up(N, D);
    zr_plan_cost k;
    TEST_OK(zr_plan_cost_of(&c, 256, N, D, &z3, &p, &k));
    TEST_NEAR(k.traffic.kind[ZR_KIND_ALLGATHER].bytes_inter, 2 * 2 * gathers, 0);
    TEST_NEAR(k.traffic.kind[ZR_KIND_REDUCE_SCATTER].bytes_inter, 2 * 2 * reduces, 0);
    TEST_NEAR(k.traffic.kind[ZR_KIND_ALLGATHER].bytes_intra, 2 * gathers, 0);
    /* compute: 1 embedding + 2 blocks + head forward, head + 2 blocks + embedding backward */
    TEST_NEAR(k.t_compute, 1e-3 + 2 * 2e-3 + 3e-3 + 4e-3 + 2 * 5e-3 + 6e-3, 1e-12);
    /* each transfer: latency + its inter bytes over the link (slower than the node level);
       with no overlap all of it is exposed */
    double t = 0;
    size_t g_units[] = {0, 1, 2, 3, 0, 2, 1};
    for (size_t i = 0; i < 7; i++) {
        t += 1e-4 + 4.0 * (double)S[g_units[i]] / 1e8;
    }
    for (int u = 0; u < 4; u++) {
        t += 1e-4 + 4.0 * (double)S[u] / 1e8;
    }
    TEST_NEAR(k.t_comm, t, 1e-12);
    TEST_NEAR(k.t_exposed, t, 1e-12);
    TEST_NEAR(k.t_step, k.t_compute + k.t_codec + k.t_exposed + k.t_optim, 1e-12);
    /* bandwidth at two message sizes (a block's 2 S[1] bytes per peer and a size below the
       embedding's, chosen so that the embedding's 2 S[0] bytes lie halfway between in log
       size): blocks at the first's rate, the final LayerNorm's few bytes at the second's (no
       extrapolation below it), the embedding at the mean of the two per-byte times */
    p.bw_msg = 2.0 * (double)S[1];
    p.bw_msg_small = 4.0 * (double)S[0] * (double)S[0] / p.bw_msg;
    p.inter_bw_small = 2e8, p.intra_bw_small = 2e10;
    double per_byte[4] = {0.5 / 2e8 + 0.5 / 1e8, 1 / 1e8, 1 / 1e8, 1 / 2e8};
    t = 0;
    for (size_t i = 0; i < 7; i++) {
        t += 1e-4 + 4.0 * (double)S[g_units[i]] * per_byte[g_units[i]];
    }
    for (int u = 0; u < 4; u++) {
        t += 1e-4 + 4.0 * (double)S[u] * per_byte[u];
    }
    zr_plan_cost k1;
    TEST_OK(zr_plan_cost_of(&c, 256, N, D, &z3, &p, &k1));
    TEST_NEAR(k1.t_comm, t, 1e-12);
    TEST_CHECK(k1.t_comm < k.t_comm);
    p.bw_msg = p.bw_msg_small = p.inter_bw_small = p.intra_bw_small = 0;
    /* full overlap hides what the computation after each post covers, never more */
    p.overlap = 1;
    zr_plan_choice pre = z3;
    pre.prefetch_bucket = 50000000;
    zr_plan_cost k2;
    TEST_OK(zr_plan_cost_of(&c, 256, N, D, &pre, &p, &k2));
    TEST_NEAR(k2.t_comm, k.t_comm, 1e-12);
    TEST_CHECK(k2.t_exposed < k.t_exposed && k2.t_exposed >= 0);
}

/*
 * Calibration on the reference steps (cost.c): priced with the calibrated
 * probe, the two ZeRO-3 references reproduce what the probe measured of
 * them: each one's computation and optimizer exactly, their steps in sum,
 * and each step where a scale on the transfers and a floor per wait can (the
 * qwZ + qgZ reference waiting relatively longer than ZeRO-3); transfers
 * priced longer where they waited longer than the transfers say, shorter
 * where they waited less. Stage 0's reference sets the waits of stages 0-2
 * and stage 0's optimizer, and reproduces its own step.
 */
static void test_calibration(void)
{
    zr_train_config c;
    tiny(&c);
    int N = 2, D = 2;
    zr_probe p = made_up(N, D);
    p.bf16_enc = p.bf16_dec = p.f32_add = 1e-9;
    p.q_enc[0] = p.q_enc[1] = p.q_dec[0] = p.q_dec[1] = 2e-9;
    p.adamw = 3e-9, p.sumsq = 1e-9;
    zr_plan_cost raw[3], cal[3];
    zr_plan_choice ref[3];
    for (int i = 0; i < 3; i++) {
        ref[i] = zr_probe_reference(i, 1, 50000000);
        TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[i], &p, &raw[i])); /* cal_batch 0: raw */
        TEST_CHECKF(raw[i].t_exposed > 0 && raw[i].t_optim > 0 && raw[i].bytes_inter > 0,
                    "reference %d: exposed %g, optimizer %g, inter-node bytes %g", i,
                    raw[i].t_exposed, raw[i].t_optim, raw[i].bytes_inter);
    }
    TEST_CHECK(raw[1].bytes_inter < raw[0].bytes_inter); /* qwZ and qgZ send fewer bytes */
    /* a machine 1.5x slower at computing, 2 ns of CPU per byte sent, an optimizer 2x slower */
    double k = 1.5, cb = 2e-9;
    p.cal_batch = 1, p.cal_prefetch = 50000000;
    for (int i = 0; i < 2; i++) {
        p.cal_compute[i] = k * (raw[i].t_compute + raw[i].t_codec) + cb * raw[i].bytes_inter;
        p.cal_optim[i] = 2 * raw[i].t_optim;
    }
    /* waits longer than the transfers, then shorter; with an overlap the scale hides more than
       in proportion, and the fit must still reproduce the steps; last, the qwZ + qgZ reference
       waits 1.6x its transfers and ZeRO-3 1.2x, which only a scale and a floor together fit */
    for (int t = 0; t < 5; t++) {
        int longer = t % 2 == 0;
        p.overlap = t == 2 || t == 3 ? 0.2 : 0;
        p.cal_batch = 0;
        for (int i = 0; i < 2; i++) {
            TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[i], &p, &raw[i]));
        }
        p.cal_batch = 1;
        double f[2] = {longer ? 1.5 : 0.5, longer ? 1.5 : 0.5}, measured = 0, predicted = 0;
        if (t == 4) {
            f[0] = 1.2, f[1] = 1.6;
        }
        for (int i = 0; i < 2; i++) {
            p.cal_step[i] = p.cal_compute[i] + p.cal_optim[i] + f[i] * raw[i].t_exposed;
        }
        for (int i = 0; i < 2; i++) {
            TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[i], &p, &cal[i]));
            TEST_NEAR(cal[i].t_compute + cal[i].t_codec, p.cal_compute[i], 1e-12);
            TEST_NEAR(cal[i].t_compute, k * raw[i].t_compute, 1e-12);
            TEST_NEAR(cal[i].t_optim, p.cal_optim[i], 1e-12);
            TEST_NEAR(cal[i].bytes_inter, raw[i].bytes_inter, 0);
            TEST_CHECK(longer ? cal[i].t_comm > raw[i].t_comm : cal[i].t_comm < raw[i].t_comm);
            if (t == 4) {
                TEST_NEAR(cal[i].t_step, p.cal_step[i], 1e-9 * p.cal_step[i]);
            }
            measured += p.cal_step[i];
            predicted += cal[i].t_step;
        }
        TEST_NEAR(predicted, measured, 1e-9 * measured);
    }
    p.overlap = 0;
    /* stage 0's reference: its own waits (here 3x the transfers) and optimizer (4x) */
    zr_plan_choice s1 = ref[2];
    s1.stage = 1;
    zr_plan_cost raw1, cal1, cal3;
    TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[0], &p, &cal3)); /* without stage 0's */
    p.cal_batch = 0;
    TEST_OK(zr_plan_cost_of(&c, 256, N, D, &s1, &p, &raw1));
    p.cal_batch = 1;
    p.cal_compute[2] = k * (raw[2].t_compute + raw[2].t_codec) + cb * raw[2].bytes_inter;
    p.cal_optim[2] = 4 * raw[2].t_optim;
    p.cal_step[2] = p.cal_compute[2] + p.cal_optim[2] + 3 * raw[2].t_exposed;
    TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[2], &p, &cal[2]));
    TEST_NEAR(cal[2].t_step, p.cal_step[2], 1e-9 * p.cal_step[2]);
    TEST_NEAR(cal[2].t_optim, p.cal_optim[2], 1e-12);
    TEST_CHECK(cal[2].t_exposed > raw[2].t_exposed);
    /* stage 1 waits as stage 0 does, and shards the optimizer as stage 3 does */
    TEST_OK(zr_plan_cost_of(&c, 256, N, D, &s1, &p, &cal1));
    TEST_NEAR(cal1.t_optim, 2 * raw1.t_optim, 1e-12);
    TEST_CHECK(cal1.t_exposed > raw1.t_exposed);
    /* stage 3 is priced as before: stage 0's reference changes nothing of it */
    TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[0], &p, &cal[0]));
    TEST_NEAR(cal[0].t_step, cal3.t_step, 1e-15);
    /* a damaged pair (bytes would have to save time) falls back to one factor, no byte cost */
    p.cal_compute[1] = 10 * p.cal_compute[0];
    zr_plan_cost odd;
    TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[1], &p, &odd));
    double kk = (p.cal_compute[0] + p.cal_compute[1]) /
                (raw[0].t_compute + raw[0].t_codec + raw[1].t_compute + raw[1].t_codec);
    TEST_NEAR(odd.t_compute + odd.t_codec, kk * (raw[1].t_compute + raw[1].t_codec),
              1e-12 * p.cal_compute[1]);
    /* the planner fits once and prices every candidate as zr_plan_cost_of does */
    c.train_batch_size = 2 * N * D;
    zr_plan_result pr;
    TEST_OK(zr_plan_run(&c, 256, &p, 0, &pr));
    TEST_CHECK(pr.n > 3 && pr.cal.calibrated && pr.cal.stage3.k_compute != 1 &&
               pr.cal.k_optim_replicated == 4);
    for (int i = 0; i < pr.n; i++) {
        zr_plan_cost one;
        TEST_OK(zr_plan_cost_of(&c, 256, N, D, &pr.entries[i].choice, &p, &one));
        TEST_NEAR(pr.entries[i].cost.t_step, one.t_step, 0);
    }
    /* a deeper run on the same probe: the fit is the one at the depth the references ran (fitted
       at the run's depth it would differ), the blocks priced one by one */
    zr_train_config deep = c;
    deep.layers = 3 * c.layers;
    zr_plan_result dr;
    zr_plan_calibration wrong;
    TEST_OK(zr_plan_run(&deep, 256, &p, 0, &dr));
    TEST_OK(zr_plan_calibrate(&deep, 256, &p, &wrong));
    TEST_CHECK(same_calib(&dr.cal, &pr.cal) && !same_calib(&wrong, &pr.cal));
    TEST_CHECK(dr.n > 0 && pr.n > 0 && dr.entries[0].cost.t_step > pr.entries[0].cost.t_step);
    zr_plan_result_free(&dr);
    zr_plan_result_free(&pr);
    /* one rank sends nothing: no scale or floor on transfers (a fit there found x0.1 from the
       steps' noise, and zr plan warned that the link figures were off) */
    zr_probe one = made_up(1, 1);
    zr_plan_choice r1 = zr_probe_reference(0, 1, 50000000);
    TEST_OK(zr_plan_cost_of(&c, 256, 1, 1, &r1, &one, &raw1));
    TEST_CHECK(raw1.t_comm == 0);
    one.cal_batch = 1, one.cal_prefetch = 50000000;
    for (int i = 0; i < 3; i++) {
        one.cal_compute[i] = 1.2 * (raw1.t_compute + raw1.t_codec);
        one.cal_optim[i] = raw1.t_optim;
        one.cal_step[i] = 0.9 * (one.cal_compute[i] + one.cal_optim[i]); /* timer noise */
    }
    zr_plan_calibration k1;
    TEST_OK(zr_plan_calibrate(&c, 256, &one, &k1));
    TEST_CHECK(k1.calibrated && k1.stage3.k_comm == 1 && k1.stage3.t_sync == 0 &&
               k1.stage012.k_comm == 1 && k1.stage012.t_sync == 0);
    /* and plans stage 0 only, even where the references price quantized steps faster (one
       probe's noise ranked stage 2 + qgZ first on one rank) */
    one.cal_compute[2] = 2 * one.cal_compute[1], one.cal_step[2] = 2 * one.cal_step[1];
    c.train_batch_size = 4;
    TEST_OK(zr_plan_run(&c, 256, &one, 0, &pr));
    TEST_CHECK(pr.n >= 1 && strstr(pr.why, "one rank: stage 0 only") != NULL);
    for (int i = 0; i < pr.n; i++) {
        const zr_plan_choice *e = &pr.entries[i].choice;
        TEST_CHECKF(e->stage == 0 && !e->qwz && !e->qgz, "one rank planned stage %d", e->stage);
    }
    zr_plan_result_free(&pr);
    /* zr plan's off-link warning: a scale under 1 counts only where no wait floor was fitted
       beside it (with one, the scale splits the waiting between bytes and waits), and not
       without references */
    zr_plan_calibration w = k1;
    TEST_NEAR(zr_plan_link_shrink(&w), 1, 0);
    w.stage3.k_comm = 0.1, w.stage3.t_sync = 2e-3;
    TEST_NEAR(zr_plan_link_shrink(&w), 1, 0);
    w.stage012.k_comm = 0.3;
    TEST_NEAR(zr_plan_link_shrink(&w), 0.3, 0);
    w.stage3.t_sync = 0;
    TEST_NEAR(zr_plan_link_shrink(&w), 0.1, 0);
    w.calibrated = 0;
    TEST_NEAR(zr_plan_link_shrink(&w), 1, 0);
}

/* A GPU probe's references: the same fit, but no cost per byte (a GPU's codecs are transfers,
   priced by the scale on them), and the fit still reproduces both ZeRO-3 steps. */
static void test_calibration_gpu(void)
{
    zr_train_config c;
    tiny(&c);
    snprintf(c.device, sizeof c.device, "cuda");
    c.bf16_enabled = 0;
    int N = 2, D = 2;
    zr_probe p = made_up(N, D);
    p.gpu = 1;
    p.bf16_enc = p.bf16_dec = p.f32_add = 1e-9;
    p.q_enc[0] = p.q_enc[1] = p.q_dec[0] = p.q_dec[1] = 2e-9;
    p.adamw = 3e-9, p.sumsq = 1e-9;
    zr_plan_cost raw[2], cal[2];
    zr_plan_choice ref[2];
    double measured = 0, predicted = 0;
    for (int i = 0; i < 2; i++) {
        ref[i] = zr_probe_reference(i, 1, 50000000);
        TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[i], &p, &raw[i]));
        zr_probe host = p;
        host.gpu = 0;
        zr_plan_cost h;
        TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[i], &host, &h));
        /* the codecs in the transfers: only the engine's own work is left on the step */
        TEST_CHECK(raw[i].t_codec < h.t_codec && raw[i].t_exposed > 0);
    }
    /* computation 2.5x and 1.5x the units (on a CPU the byte cost would explain the difference;
       on a GPU it is one factor), the optimizer 2x, waits 1.3x and 1.7x the transfers */
    p.cal_batch = 1, p.cal_prefetch = 50000000;
    for (int i = 0; i < 2; i++) {
        p.cal_compute[i] = (i ? 1.5 : 2.5) * (raw[i].t_compute + raw[i].t_codec);
        p.cal_optim[i] = 2 * raw[i].t_optim;
        p.cal_step[i] = p.cal_compute[i] + p.cal_optim[i] + (i ? 1.7 : 1.3) * raw[i].t_exposed;
        measured += p.cal_step[i];
    }
    zr_plan_calibration k;
    TEST_OK(zr_plan_calibrate(&c, 256, &p, &k));
    TEST_CHECK(k.calibrated && k.stage3.c_byte == 0 && k.stage3.k_optim == 2);
    TEST_NEAR(k.stage3.k_compute,
              (p.cal_compute[0] + p.cal_compute[1]) /
                  (raw[0].t_compute + raw[0].t_codec + raw[1].t_compute + raw[1].t_codec),
              1e-12);
    for (int i = 0; i < 2; i++) {
        TEST_OK(zr_plan_cost_of(&c, 256, N, D, &ref[i], &p, &cal[i]));
        TEST_CHECK(cal[i].t_exposed > raw[i].t_exposed);
        predicted += cal[i].t_step;
    }
    TEST_NEAR(predicted, measured, 1e-9 * measured);
}

/* The probe's three reference configurations ran, at micro-batch b. */
static void check_references(const zr_probe *p, int b)
{
    TEST_EQ_INT(p->cal_batch, b);
    for (int i = 0; i < 3; i++) {
        TEST_CHECKF(p->cal_step[i] > 0 && p->cal_compute[i] > 0 && p->cal_comm[i] >= 0 &&
                        p->cal_optim[i] > 0,
                    "reference %d: step %g, compute %g, comm %g, optim %g", i, p->cal_step[i],
                    p->cal_compute[i], p->cal_comm[i], p->cal_optim[i]);
    }
}

/* Rewrite the file at path without the lines that contain any of the keys. */
static void drop_keys(const char *path, const char *const *keys, int n)
{
    char text[1 << 16], *lines[1024];
    FILE *f = fopen(path, "r");
    TEST_CHECK(f != NULL);
    size_t len = fread(text, 1, sizeof text - 1, f);
    TEST_CHECK(len < sizeof text - 1);
    fclose(f);
    text[len] = 0;
    int nl = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l != NULL && nl < 1024;
         l = strtok_r(NULL, "\n", &save)) {
        lines[nl++] = l;
    }
    f = fopen(path, "w");
    TEST_CHECK(f != NULL);
    for (int i = 0; i < nl; i++) {
        int keep = 1;
        for (int j = 0; j < n; j++) {
            keep = keep && strstr(lines[i], keys[j]) == NULL;
        }
        if (keep) {
            TEST_CHECK(fprintf(f, "%s\n", lines[i]) > 0);
        }
    }
    TEST_CHECK(fclose(f) == 0);
}

/* The bandwidth at a second message size: measured, kept by the file, optional in it (a probe of
   an earlier zr has none: 0, every size at the first), checked where present. */
static void check_second_size(const char *path, const zr_probe *p)
{
    TEST_CHECK(p->bw_msg >= 65536 && p->bw_msg_small == p->bw_msg / 4);
    TEST_CHECK(p->nodes == 1 || p->inter_bw_small > 0);
    TEST_CHECK(p->ranks_per_node == 1 || p->intra_bw_small > 0);
    zr_probe q, w = *p;
    TEST_OK(zr_probe_write(path, &w));
    TEST_OK(zr_probe_read(path, &q));
    TEST_CHECK(q.bw_msg == p->bw_msg && q.bw_msg_small == p->bw_msg_small &&
               fabs(q.inter_bw_small - p->inter_bw_small) <= 1e-15 * p->inter_bw_small &&
               fabs(q.intra_bw_small - p->intra_bw_small) <= 1e-15 * p->intra_bw_small);
    static const char *const second[] = {"\"bw_msg\"", "\"bw_msg_small\"", "\"intra_bw_small\"",
                                         "\"inter_bw_small\""};
    drop_keys(path, second, 4);
    TEST_OK(zr_probe_read(path, &q));
    TEST_CHECK(q.bw_msg == 0 && q.bw_msg_small == 0 && q.intra_bw_small == 0 &&
               q.inter_bw_small == 0 && fabs(q.inter_bw - p->inter_bw) <= 1e-15 * p->inter_bw);
    w.bw_msg_small = w.bw_msg;
    TEST_OK(zr_probe_write(path, &w));
    TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, "\"bw_msg_small\"");
    int inter = p->nodes > 1;
    if (inter || p->ranks_per_node > 1) {
        w = *p;
        *(inter ? &w.inter_bw_small : &w.intra_bw_small) = 0;
        TEST_OK(zr_probe_write(path, &w));
        TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT,
                   inter ? "\"inter_bw_small\" is 0" : "\"intra_bw_small\" is 0");
    }
    w = *p;
    w.inter_bw_small = -1;
    TEST_OK(zr_probe_write(path, &w));
    TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, "\"inter_bw_small\" is -1");
}

static void test_probe_file(void)
{
    zr_train_config c;
    tiny(&c);
    zr_comm comm;
    TEST_OK(zr_comm_init(&comm, MPI_COMM_WORLD, NULL));
    zr_probe p;
    TEST_OK(zr_probe_run(&comm, &c, 256, 3, &p));
    TEST_EQ_INT(p.world, W);
    TEST_EQ_INT(p.ncompute, 3); /* 1, 2 and 3 */
    TEST_EQ_INT(p.compute[2].batch, 3);
    TEST_CHECK(p.compute[0].fwd_block > 0 && p.compute[0].bwd_block > 0);
    TEST_CHECK(p.q_enc[0] > 0 && p.adamw > 0 && p.base_rss > 1e6);
    TEST_CHECK(p.nodes == 1 || p.inter_bw > 0);
    TEST_CHECK(p.overlap >= 0 && p.overlap <= 1);
    /* the reference steps ran (ZeRO-3 without and with qwZ + qgZ, stage 0; the configuration's
       micro-batch) */
    check_references(&p, c.train_micro_batch_size_per_gpu);
    zr_comm_free(&comm);
    if (R != 0) {
        return;
    }
    char path[] = "/tmp/zr-test-plan-XXXXXX";
    int fd = mkstemp(path);
    TEST_CHECK(fd >= 0);
    close(fd);
    TEST_OK(zr_probe_write(path, &p));
    zr_probe q;
    TEST_OK(zr_probe_read(path, &q));
    for (int i = 0; i < p.ncompute; i++) {
        TEST_CHECK(p.compute[i].batch == q.compute[i].batch &&
                   fabs(p.compute[i].bwd_block - q.compute[i].bwd_block) <=
                       1e-15 * p.compute[i].bwd_block);
    }
    /* cJSON writes 17 significant digits; its reader may land one ulp away */
    TEST_CHECKF(fabs(p.inter_bw - q.inter_bw) <= 1e-15 * p.inter_bw &&
                    fabs(p.q_dec[1] - q.q_dec[1]) <= 1e-15 * p.q_dec[1] && p.world == q.world,
                "inter_bw %.17g vs %.17g, q4 dec %.17g vs %.17g", p.inter_bw, q.inter_bw,
                p.q_dec[1], q.q_dec[1]);
    TEST_CHECK(q.cal_batch == p.cal_batch &&
               fabs(p.cal_step[1] - q.cal_step[1]) <= 1e-15 * p.cal_step[1] &&
               fabs(p.cal_optim[0] - q.cal_optim[0]) <= 1e-15 * p.cal_optim[0]);
    static const char *bad[][2] = {
        {"{\"version\": 3}", "\"gpu\" is missing"},
        {"{\"version\": 2, \"world\": 4}", "probe version 2, this zr reads version 3"},
        {"[1, 2]", "is not a JSON object"},
        {"{\"version\": ", "is not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        TEST_CHECK(f != NULL && fputs(bad[i][0], f) >= 0 && fclose(f) == 0);
        TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, bad[i][1]);
        TEST_CHECK(strstr(zr_error_message(), path) != NULL);
    }
    zr_probe w = p;
    w.version = 99;
    TEST_OK(zr_probe_write(path, &w));
    TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, "probe version 99");
    w = p;
    w.world = p.world + 1;
    TEST_OK(zr_probe_write(path, &w));
    TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, "is not nodes");
    w = p;
    w.overlap = -0.5;
    TEST_OK(zr_probe_write(path, &w));
    TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, "\"overlap\" is -0.5");
    w = p;
    w.cal_step[1] = 0;
    TEST_OK(zr_probe_write(path, &w));
    TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, "\"calq_step\"");
    w = p;
    w.cal_step[2] = w.cal_compute[2] = w.cal_comm[2] = w.cal_optim[2] = 0; /* missing whole */
    TEST_OK(zr_probe_write(path, &w));
    TEST_OK(zr_probe_read(path, &q));
    w.cal_comm[2] = 0.01; /* not in part */
    TEST_OK(zr_probe_write(path, &w));
    TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, "\"cald_step\"");
    w = p;
    w.cal_comm[0] = -1;
    TEST_OK(zr_probe_write(path, &w));
    TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, "\"cal_comm\" is -1");
    check_second_size(path, &p);
    TEST_FAILS(zr_probe_read("/nonexistent/probe.json", &q), ZR_ERR_IO, "/nonexistent/probe.json");
    unlink(path);
}

static void test_planner(void)
{
    zr_train_config c;
    tiny(&c);
    c.train_batch_size = 8 * 4; /* 8 sequences per rank on 2x2 */
    zr_probe p = made_up(2, 2);
    p.ncompute = 2;
    p.compute[1] = (zr_probe_compute){8, 8e-3, 16e-3, 24e-3, 32e-3, 40e-3, 48e-3};
    p.bf16_enc = p.bf16_dec = p.f32_add = 1e-10;
    p.q_enc[0] = p.q_enc[1] = p.q_dec[0] = p.q_dec[1] = 1e-10;
    p.inter_bw = 1e6; /* a slow link: quantize everything, keep backward gathers local */
    zr_plan_result r;
    TEST_OK(zr_plan_run(&c, 256, &p, 0, &r));
    if (r.n > 0) {
        const zr_plan_choice *w = &r.entries[0].choice;
        char d[160];
        zr_plan_describe(w, d, sizeof d);
        TEST_CHECKF(w->stage == 3 && w->qwz && w->qgz && w->hpz == 2, "slow link picked %s", d);
        TEST_CHECK(strstr(r.why, "wins") != NULL);
        /* ties in time and memory rank the larger prefetch budget first, then a fixed order:
           no two entries are the same choice, and the order does not depend on qsort's */
        int ties = 0;
        for (int i = 1; i < r.n; i++) {
            const zr_plan_entry *a = &r.entries[i - 1], *b = &r.entries[i];
            TEST_CHECK(b->cost.tokens_per_s <= a->cost.tokens_per_s);
            if (b->cost.tokens_per_s == a->cost.tokens_per_s &&
                b->cost.mem.total == a->cost.mem.total) {
                ties++;
                TEST_CHECK(b->choice.prefetch_bucket <= a->choice.prefetch_bucket);
                TEST_CHECK(memcmp(&a->choice, &b->choice, sizeof a->choice) != 0);
            }
        }
        TEST_CHECKF(ties > 0, "no entries tied in time and memory (%d entries)", r.n);
        TEST_EQ_INT(r.considered, r.n + r.over_memory);
    }
    zr_plan_result_free(&r);
    /* quantization no coarser than the configuration's: INT4 weights only when asked for */
    for (int bits = 8; bits >= 4; bits -= 4) {
        c.qwz_bits = bits;
        TEST_OK(zr_plan_run(&c, 256, &p, 0, &r));
        int w4 = 0, g4 = 0;
        for (int i = 0; i < r.n; i++) {
            w4 += r.entries[i].choice.qwz && r.entries[i].choice.qwz_bits == 4;
            g4 += r.entries[i].choice.qgz && r.entries[i].choice.qgz_bits == 4;
        }
        TEST_CHECKF(bits == 8 ? w4 == 0 : w4 > 0, "qwz_bits %d: %d INT4-weight entries", bits, w4);
        TEST_CHECK(g4 > 0);
        if (bits == 4 && r.n > 0) { /* on this slow link the coarsest weights win once allowed */
            TEST_EQ_INT(r.entries[0].choice.qwz_bits, 4);
        }
        zr_plan_result_free(&r);
    }
    c.qgz_bits = 8;
    TEST_OK(zr_plan_run(&c, 256, &p, 0, &r));
    for (int i = 0; i < r.n; i++) {
        TEST_CHECK(!r.entries[i].choice.qgz || r.entries[i].choice.qgz_bits == 8);
    }
    zr_plan_result_free(&r);
    c.qwz_bits = 8, c.qgz_bits = 4;
    /* a free link and costly codecs: no quantization wins */
    p.inter_bw = 1e13, p.intra_bw = 1e13, p.inter_lat = p.intra_lat = 0;
    p.q_enc[0] = p.q_enc[1] = p.q_dec[0] = p.q_dec[1] = 1e-6;
    TEST_OK(zr_plan_run(&c, 256, &p, 0, &r));
    if (r.n > 0) {
        TEST_CHECK(!r.entries[0].choice.qwz && !r.entries[0].choice.qgz);
    }
    zr_plan_result_free(&r);
    /* impossible requests */
    c.train_batch_size = 6; /* not a multiple of 4 ranks */
    TEST_FAILS(zr_plan_run(&c, 256, &p, 0, &r), ZR_ERR_INVALID, "cannot be split evenly");
    c.train_batch_size = 2; /* fewer sequences than ranks */
    TEST_FAILS(zr_plan_run(&c, 256, &p, 0, &r), ZR_ERR_INVALID, "cannot be split evenly");
    c.train_batch_size = 4 * 16; /* 16 per rank, but the probe measured up to 8 */
    TEST_OK(zr_plan_run(&c, 256, &p, 0, &r));
    TEST_CHECK(r.n > 0);
    for (int i = 0; i < r.n; i++) {
        const zr_plan_choice *ch = &r.entries[i].choice;
        TEST_CHECKF(ch->micro_batch <= 8 && ch->micro_batch * ch->accum == 16,
                    "micro %d x accum %d", ch->micro_batch, ch->accum);
    }
    zr_plan_result_free(&r);
    c.train_batch_size = 4 * 7 * 11; /* 77 per rank: divisors 1, 7, 11, 77 */
    p.ncompute = 1;
    p.compute[0].batch = 1;
    TEST_OK(zr_plan_run(&c, 256, &p, 0, &r));
    zr_plan_result_free(&r);
    c.train_batch_size = 32;
    TEST_FAILS(zr_plan_run(&c, 256, &p, 1e6, &r), ZR_ERR_INVALID,
               "no configuration fits the memory limit");
    p.world = 5;
    TEST_FAILS(zr_plan_run(&c, 256, &p, 0, &r), ZR_ERR_INVALID, "not one the engine can run");
    p.world = 4;
    /* a probe of another model (but for its depth) prices nothing of this one */
    static const char *const key[] = {"zr.model.channels is 64 there, 128 here",
                                      "zr.model.heads is 4 there, 8 here",
                                      "zr.model.seq_len is 16 there, 8 here",
                                      "zr.model.max_seq_len is 16 there, 32 here",
                                      "zr.model.vocab_size",
                                      "zr.model.activation_checkpointing",
                                      "zr.train.threads is 1 there, 2 here"};
    for (int i = 0; i < 7; i++) {
        zr_train_config o = c;
        int v = 256;
        o.channels = i == 0 ? 128 : o.channels;
        o.heads = i == 1 ? 8 : o.heads;
        o.seq_len = i == 2 ? 8 : o.seq_len;
        o.max_seq_len = i == 3 ? 32 : o.max_seq_len;
        v = i == 4 ? 300 : v;
        o.activation_checkpointing = i == 5;
        o.threads = i == 6 ? 2 : o.threads;
        TEST_FAILS(zr_plan_run(&o, v, &p, 0, &r), ZR_ERR_INVALID, key[i]);
    }
    zr_plan_choice bad = {2, 1, 8, 1, 0, 0, 0, 1, 1};
    zr_plan_cost k;
    TEST_FAILS(zr_plan_cost_of(&c, 256, 2, 2, &bad, &p, &k), ZR_ERR_INVALID, "need stage 3");
    bad = (zr_plan_choice){3, 0, 0, 3, 0, 0, 0, 1, 1};
    TEST_FAILS(zr_plan_cost_of(&c, 256, 2, 2, &bad, &p, &k), ZR_ERR_INVALID,
               "must divide the ranks per node");
}

/* The probe on GPUs, and a plan from it, against a GPU run. */
static void test_gpu_probe(void)
{
    zr_train_config c;
    tiny(&c);
    snprintf(c.device, sizeof c.device, "cuda");
    c.bf16_enabled = 0; /* fp32 compute and wire: what the trainer then runs */
    TEST_OK(zr_config_finalize(&c, W));
    zr_comm comm;
    TEST_OK(zr_comm_init(&comm, MPI_COMM_WORLD, NULL));
    zr_probe p;
    TEST_OK(zr_probe_run(&comm, &c, 256, 2, &p));
    /* the probe hands the communicator back moving host memory */
    TEST_CHECK(zr_comm_device(&comm, NULL) == NULL);
    zr_comm_free(&comm);
    TEST_CHECK(p.gpu == 1 && p.bf16 == 0);
    TEST_EQ_INT(p.ncompute, 2);
    TEST_CHECK(p.compute[1].fwd_block > 0 && p.compute[1].bwd_block > 0);
    TEST_CHECK(p.q_enc[0] > 0 && p.q_dec[1] > 0 && p.adamw > 0 && p.f32_add > 0);
    TEST_CHECK(p.nodes == 1 || (p.inter_bw > 0 && p.inter_bw_small > 0));
    TEST_CHECK(p.overlap >= 0 && p.overlap <= 1);
    TEST_CHECKF(p.base_rss == 0 && p.mem_per_rank > 1e6, "base %g, memory per rank %g", p.base_rss,
                p.mem_per_rank);
    /* the reference steps ran on the GPUs (the device model and engine; the probe's stream
       followed again after them, or the measurements above would have failed) */
    check_references(&p, c.train_micro_batch_size_per_gpu);
    /* a plan: the device model's bytes stand for the activations */
    c.train_batch_size = 2 * W;
    zr_plan_result r;
    TEST_OK(zr_plan_run(&c, 256, &p, p.mem_per_rank, &r));
    TEST_CHECK(r.n > 0 && r.cal.calibrated && r.cal.stage3.c_byte == 0);
    if (r.n > 0) {
        const zr_plan_entry *best = &r.entries[0];
        zr_gpt_config m = {c.max_seq_len, 256, 256, c.layers, c.heads, c.channels};
        zr_engine_config ecfg = zr_config_engine(&c, ZR_DTYPE_BF16);
        zr_gpt_shape sh = {best->choice.micro_batch, c.seq_len, 0, ZR_DTYPE_F32};
        TEST_CHECKF(best->cost.mem.activations == zr_gpt_cuda_engine_bytes(&m, &sh, &ecfg),
                    "plan's activations %zu", best->cost.mem.activations);
        TEST_CHECK(best->cost.tokens_per_s > 0);
    }
    zr_plan_result_free(&r);
    /* a GPU run counts what the plan predicts, and holds the state and pool it predicts */
    zr_plan_choice ch = {3, 1, 8, W > 1 ? 2 : 1, 1, 4, 0, 1, 1};
    if (W % 2 == 0 && W > 1) {
        check_choice(&c, &ch, &p);
    }
    /* bf16 compute: the engine's bf16 working buffers, in the plan's state and pool too (the
       probe's figures are fp32's; only the compute type matters to the bytes) */
    zr_probe pb = p;
    pb.bf16 = 1;
    c.bf16_enabled = 1;
    if (W % 2 == 0 && W > 1) {
        check_choice(&c, &ch, &pb);
        zr_plan_choice s2 = {2, 0, 0, 1, 0, 0, 0, 1, 1};
        check_choice(&c, &s2, &pb);
    }
    /* a bf16 probe: its reference steps ran too, with the bf16 device model and engine */
    zr_probe q;
    TEST_OK(zr_comm_init(&comm, MPI_COMM_WORLD, NULL));
    TEST_OK(zr_probe_run(&comm, &c, 256, 1, &q));
    zr_comm_free(&comm);
    TEST_CHECK(q.gpu == 1 && q.bf16 == 1);
    check_references(&q, c.train_micro_batch_size_per_gpu);
    /* a probe of one device plans only for it */
    c.bf16_enabled = 0;
    snprintf(c.device, sizeof c.device, "cpu");
    TEST_FAILS(zr_plan_run(&c, 256, &p, 0, &r), ZR_ERR_INVALID, "the probe measured GPUs");
    snprintf(c.device, sizeof c.device, "cuda");
    c.bf16_enabled = 1;
    TEST_FAILS(zr_plan_run(&c, 256, &p, 0, &r), ZR_ERR_INVALID, "fp32 compute on the GPUs");
}

/* The peers of my group g on my node and off it, one by one (zr_comm_peers counts them). */
static void peers_visited(const zr_comm *c, zr_group g, int *on, int *off)
{
    *on = *off = 0;
    for (int k = 0; k < c->size[g]; k++) {
        if (k != c->rank[g]) {
            int same = zr_comm_node_of(c, zr_comm_world_rank(c, g, k)) == c->node;
            *on += same, *off += !same;
        }
    }
}

/* zr_comm_peers, counted, equals the per-peer visit on every group of every rank of every layout
   up to 7 x 8 (every hpZ size the layout takes), and on ranks of a 2^12 x 2^12 world. */
static void test_peers_counted(void)
{
    if (R != 0) {
        return; /* no MPI in it: once is enough */
    }
    int layouts = 0;
    for (int n = 1; n <= 7; n++) {
        for (int d = 1; d <= 8; d++) {
            for (int h = 0; h <= n * d; h++) {
                zr_comm c;
                for (int r = 0; r < n * d && zr_comm_init_layout(&c, n, d, h, r) == ZR_OK; r++) {
                    layouts += r == 0;
                    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
                        int on, off, von, voff;
                        zr_comm_peers(&c, (zr_group)g, &on, &off);
                        peers_visited(&c, (zr_group)g, &von, &voff);
                        TEST_CHECKF(on == von && off == voff,
                                    "%dx%d hpZ %d rank %d group %d: %d/%d counted, %d/%d visited",
                                    n, d, h, r, g, on, off, von, voff);
                    }
                }
            }
        }
    }
    TEST_CHECKF(layouts > 200, "%d layouts", layouts);
    const int big = 1 << 12, ranks[] = {0, big * big - 1, big * 1000 + 17};
    for (int i = 0; i < 3; i++) {
        zr_comm c;
        TEST_OK(zr_comm_init_layout(&c, big, big, 64, ranks[i]));
        for (int g = 0; g < ZR_GROUP_COUNT; g++) {
            int on, off, von, voff;
            zr_comm_peers(&c, (zr_group)g, &on, &off);
            peers_visited(&c, (zr_group)g, &von, &voff);
            TEST_CHECK(on == von && off == voff);
        }
    }
    zr_comm c;
    TEST_FAILS(zr_comm_init_layout(&c, 1 << 16, 1 << 16, 0, 0), ZR_ERR_INVALID,
               "65536 nodes x 65536 ranks");
}

/* Whether two costs are the same: bytes, calls and memory exactly, times to rounding. */
static int same_cost(const zr_plan_cost *a, const zr_plan_cost *b)
{
    int same = memcmp(&a->traffic, &b->traffic, sizeof a->traffic) == 0 &&
               memcmp(&a->mem, &b->mem, sizeof a->mem) == 0;
    const double x[] = {a->t_compute, a->t_codec, a->t_comm, a->t_exposed, a->t_optim, a->t_step},
                 y[] = {b->t_compute, b->t_codec, b->t_comm, b->t_exposed, b->t_optim, b->t_step};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) {
        same = same && fabs(x[i] - y[i]) <= 1e-12 * fmax(fabs(x[i]), 1e-300);
    }
    return same;
}

/* Beyond 8 micro-batches the dry run counts the repeats of one instead of walking them
   (cost.c, WALK_EXACT): every configuration of a plan at 2x2, 3x2 and 1x4 with 24 and 37
   micro-batches costs the same either way (ZR_PLAN_WALK_ALL=1 walks them all). */
static void test_accumulation_counted(void)
{
    if (R != 0) {
        return; /* no MPI in it: once is enough */
    }
    static const int layout[][2] = {{2, 2}, {3, 2}, {1, 4}};
    for (int l = 0; l < 3; l++) {
        int N = layout[l][0], D = layout[l][1];
        for (int accum = 24; accum <= 37; accum += 13) {
            zr_train_config c;
            tiny(&c);
            c.train_batch_size = (long long)N * D * accum;
            zr_probe p = made_up(N, D);
            p.overlap = 0.3; /* transfers in flight across micro-batches */
            p.bf16_enc = p.bf16_dec = p.f32_add = p.sumsq = p.adamw = 1e-9;
            p.q_enc[0] = p.q_enc[1] = p.q_dec[0] = p.q_dec[1] = 1e-9;
            zr_plan_result r;
            TEST_OK(zr_plan_run(&c, 256, &p, 0, &r));
            int checked = 0;
            for (int i = 0; i < r.n; i++) {
                const zr_plan_choice *ch = &r.entries[i].choice;
                zr_plan_cost walked;
                setenv("ZR_PLAN_WALK_ALL", "1", 1);
                TEST_OK(zr_plan_cost_calibrated(&c, 256, N, D, ch, &p, &r.cal, &walked));
                unsetenv("ZR_PLAN_WALK_ALL");
                char d[160];
                zr_plan_describe(ch, d, sizeof d);
                TEST_CHECKF(same_cost(&r.entries[i].cost, &walked),
                            "%dx%d %s: counted step %.17g s, %llu bytes; walked %.17g s, %llu", N,
                            D, d, r.entries[i].cost.t_step,
                            (unsigned long long)r.entries[i].cost.bytes_inter, walked.t_step,
                            (unsigned long long)walked.bytes_inter);
                checked += ch->accum > 8;
            }
            TEST_CHECKF(checked > 10, "%d configurations with more than 8 micro-batches", checked);
            zr_plan_result_free(&r);
        }
    }
}

/* A plan for 2^24 ranks (2^22 nodes x 4, and one node of 2^20), 10^6 ranks, and 2^20
   micro-batches per step: each is planned (before, the dry run visited every peer of every
   collective, kept a list entry per rank of a node, and walked every micro-batch: hours), and
   holds no memory that grows with them. More than 2^24 ranks, a deeper probe than a model can
   be, a micro-batch beyond the probe's are refused naming the key. */
static void test_huge_inputs(void)
{
    if (R != 0) {
        return; /* no MPI in it: once is enough */
    }
    static const struct {
        int nodes, D;
        long long batch;
    } big[] = {
        {1 << 22, 4, 1LL << 24}, {1, 1 << 20, 1LL << 21}, {250000, 4, 1000000}, {2, 2, 4LL << 20}};
    size_t peak = zr_mem_peak(), base = zr_mem_current();
    for (int i = 0; i < 4; i++) {
        zr_train_config c;
        tiny(&c);
        c.train_batch_size = big[i].batch;
        zr_probe p = made_up(big[i].nodes, big[i].D);
        zr_plan_result r;
        TEST_OK(zr_plan_run(&c, 256, &p, 0, &r));
        TEST_CHECKF(r.n > 0 && r.entries[0].cost.tokens_per_s > 0, "%d x %d: %d entries",
                    big[i].nodes, big[i].D, r.n);
        zr_plan_result_free(&r);
    }
    size_t now = zr_mem_peak();
    TEST_CHECKF(now <= peak || now - base < (16u << 20), "the plans' peak %zu bytes above %zu",
                now - base, base);
    zr_probe p = made_up(97 * 257, 673); /* 2^24 + 1 ranks */
    zr_train_config c;
    tiny(&c);
    c.train_batch_size = p.world;
    zr_plan_result r;
    TEST_FAILS(zr_plan_run(&c, 256, &p, 0, &r), ZR_ERR_INVALID, "world (16777217 ranks)");
    char path[] = "/tmp/zr-test-plan-XXXXXX";
    int fd = mkstemp(path);
    TEST_CHECK(fd >= 0);
    close(fd);
    static const struct {
        int key, v;
        const char *msg;
    } bad[] = {
        {0, 97 * 257, "\"world\" is 16777217, outside [1, 16777216] (ranks no machine has"},
        {1, 1 << 23, "\"nodes\" is 33554432"}, /* nodes x D overflows an int: refused, not UB */
        {2, 1025, "\"layers\" is 1025, outside [1, 1024]"},
        {3, 65537, "\"cal_batch\" is 65537, outside [0, 65536]"},
        {4, 65537, "\"batch\" is 65537, outside [1, 65536]"},
    };
    for (int i = 0; i < 5; i++) {
        zr_probe w = made_up(2, 2), q;
        w.q_enc[0] = w.q_enc[1] = w.q_dec[0] = w.q_dec[1] = 1e-9;
        w.adamw = w.sumsq = w.bf16_enc = w.bf16_dec = w.f32_add = 1e-9;
        if (bad[i].key == 0) {
            w.nodes = bad[i].v, w.ranks_per_node = 673, w.world = bad[i].v * 673;
        } else if (bad[i].key == 1) {
            w.nodes = bad[i].v * 4, w.ranks_per_node = 1 << 23, w.world = 4;
        } else if (bad[i].key == 2) {
            w.layers = bad[i].v;
        } else if (bad[i].key == 3) {
            w.cal_batch = bad[i].v;
        } else {
            w.compute[0].batch = bad[i].v;
        }
        TEST_OK(zr_probe_write(path, &w));
        TEST_FAILS(zr_probe_read(path, &q), ZR_ERR_FORMAT, bad[i].msg);
    }
    zr_probe w = made_up(1 << 12, 1 << 12), q; /* 2^24: read */
    w.q_enc[0] = w.q_enc[1] = w.q_dec[0] = w.q_dec[1] = 1e-9;
    w.adamw = w.sumsq = w.bf16_enc = w.bf16_dec = w.f32_add = 1e-9;
    TEST_OK(zr_probe_write(path, &w));
    TEST_OK(zr_probe_read(path, &q));
    TEST_EQ_INT(q.world, 1 << 24);
    unlink(path);
}

int main(int argc, char **argv)
{
    int gpu = argc > 1 && strcmp(argv[1], "--gpu") == 0;
#if ZR_CUDA_EMU
    if (gpu) {
        setenv("ZR_EMU_DEVICES", "2", 1); /* a GPU per rank of a 2-rank node: NCCL */
    }
#endif
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    if (gpu) {
        int n = 0, has = zr_device_cuda_count(&n) == ZR_OK, all = 0;
        MPI_Allreduce(&has, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all) {
            return zr_test_skip("%s", has ? "a rank sees no GPU" : zr_error_message());
        }
        TEST_RUN(test_gpu_probe);
        return zr_test_finish();
    }
    TEST_RUN(test_bytes_match_engine);
    TEST_RUN(test_by_hand);
    TEST_RUN(test_calibration);
    TEST_RUN(test_calibration_gpu);
    TEST_RUN(test_probe_file);
    TEST_RUN(test_planner);
    TEST_RUN(test_peers_counted);
    TEST_RUN(test_accumulation_counted);
    TEST_RUN(test_huge_inputs);
    return zr_test_finish();
}
