/*
 * probe_ref.c - the probe's reference steps: a few steps of three
 * configurations through the real engine and model, which the cost model is
 * calibrated on (cost.c). Why they are needed is below.
 */
#define _POSIX_C_SOURCE 200809L

#include "probe_impl.h"

#include "zr/model_cuda.h"

#include <stdio.h>
#include <string.h>

/*
 * What the probe's units and rates (probe.c) cannot see, a training step shows: the
 * step touches the whole model's state, long out of the caches the probe's
 * repeated units keep warm; a rank that waits spins on the cores its node's
 * other ranks compute on; the kernel's network work runs there too; and each
 * synchronisation waits for the rank that was descheduled longest. So the
 * probe also runs three reference configurations (zr_probe_reference):
 * ZeRO-3 without and with qwZ and qgZ (the most and the fewest bytes of
 * stage 3) and stage 0 (reductions at the step, the whole optimizer on every
 * rank), on the real engine and model, CAL_BLOCKS rounds of CAL_STEPS steps
 * each (after CAL_WARM that warm up), and records their split as the trainer
 * reports it; cost.c calibrates the cost model on them. Each figure is the
 * median of its 24 steps, the rounds spreading them over the probe: a
 * shared machine's speed drifts, and the training the plan is for runs
 * longer than the probe (on the 2-core VM of bench/cluster/README.md, two
 * rounds of one probe, seconds apart, measured ZeRO-3 at 330-360 and
 * 265-287 ms; one probe's figures can be 20-35% off another launch's). Eight
 * rounds rather than four: on that VM (2x2 at 10 Gbit/s, six probes each)
 * stage 0's step over ZeRO-3 + qwZ + qgZ's, which decides between stages
 * 0-2 and 3, spread with a standard deviation of 0.027 over probes of eight
 * rounds and 0.072 over the first four rounds of the same probes (one probe
 * of four had put stage 0 first on a link where it measured 0.86 of ZeRO++).
 * This adds 120 steps of the model to the probe (about 20 s more there),
 * fewer rounds where they would take over CAL_BUDGET_S (GPT-2 124M on a CPU:
 * a step takes seconds).
 *
 * A GPU probe runs them too, on the GPUs, with the device model and engine
 * the trainer builds there: a step there launches hundreds of kernels the
 * probe timed one unit at a time, waits for the host once per step, and
 * its collectives (NCCL's kernels, or the staged transport's copies) share
 * the GPU with the computation; none of that is in the unit timings.
 */
/* the second step of a fresh engine still grows its pool (cost.c): two steps warm up */
enum { CAL_WARM = 2, CAL_STEPS = 3, CAL_BLOCKS = 8, CAL_N = CAL_STEPS * CAL_BLOCKS };
_Static_assert(CAL_STEPS == 3, "the info line prints three steps");
#define CAL_BUDGET_S 60.0 /* no round starts that would end the rounds past this, but the first */

zr_plan_choice zr_probe_reference(int r, int b, long long prefetch_bucket)
{
    int q = r == 1;
    zr_plan_choice ch = {r == 2 ? 0 : 3, q, q ? 8 : 0, 1, q, q ? 4 : 0, prefetch_bucket, b, 1};
    return ch;
}

/* The device of the probe's stream s, the CPU without one. */
static zr_device probe_device(zr_stream *s)
{
    return s != NULL ? *zr_stream_device(s) : zr_device_cpu();
}

/* The engine settings of reference r: cfg with the reference's choice applied, as the trainer
 * derives them for the backend of g's architecture on the probe's device (stream s; NULL: the
 * CPU). */
static zr_status reference_engine(const zr_train_config *cfg, const zr_gpt_config *g, int r,
                                  zr_stream *s, const zr_gpt_backend_i **be, zr_engine_config *out)
{
    ZR_CHECK(zr_gpt_backend_for(g, probe_device(s).kind, be));
    zr_train_config rc = *cfg;
    zr_plan_choice ref = zr_probe_reference(r, cfg->train_micro_batch_size_per_gpu,
                                            cfg->stage3_prefetch_bucket_size);
    zr_plan_apply(&rc, &ref);
    *out = zr_config_engine(&rc, (*be)->bf16_work_type);
    return ZR_OK;
}

/* A step's figures: the slowest rank's step, and the ranks' mean compute, comm and optimizer. */
typedef double cal_rec[4];

/*
 * A reference's model, built as the trainer builds it, on the probe's device
 * (s, the probe's stream: its GPU; NULL: the CPU), in the engine's working
 * type (bf16.enabled on a GPU: bf16; on the CPU fp32, its products fp32),
 * and where the model queues its work on a stream, the communicator
 * following that stream while it runs (the engine's kernels and collectives
 * start after the model's work there), the probe's stream again after.
 */
typedef struct ref_model {
    zr_gpt_run run;
    zr_stream *probe;
} ref_model;

static zr_status ref_model_init(ref_model *rm, zr_comm *c, const zr_train_config *cfg,
                                const zr_gpt_config *g, const zr_engine_config *ecfg, zr_stream *s)
{
    memset(rm, 0, sizeof *rm);
    rm->probe = s;
    zr_device dev = probe_device(s);
    zr_gpt_shape sh = {cfg->train_micro_batch_size_per_gpu, cfg->seq_len,
                       cfg->activation_checkpointing, ecfg->work_type};
    ZR_CHECK(zr_gpt_run_init(&rm->run, &dev, g, &sh, ecfg));
    zr_stream *ms = zr_gpt_run_stream(&rm->run);
    return ms != NULL ? zr_comm_device_follow(c, ms) : ZR_OK;
}

/* After the engine is gone; safe after a failed init. */
static zr_status ref_model_free(ref_model *rm, zr_comm *c)
{
    zr_status st = rm->probe != NULL ? zr_comm_device_follow(c, rm->probe) : ZR_OK;
    zr_gpt_run_free(&rm->run);
    return st;
}

/* CAL_WARM steps of the reference, then CAL_STEPS measured into rec (collective). */
static zr_status reference_run(zr_comm *c, ref_model *rm, zr_engine *e, const int *tok,
                               cal_rec *rec)
{
    int W = c->size[ZR_GROUP_WORLD];
    zr_status st = ZR_OK;
    for (int k = -CAL_WARM; k < CAL_STEPS && st == ZR_OK; k++) {
        zr_step_stats stats;
        float loss = 0;
        st = zr_comm_barrier(c);
        if (st == ZR_OK) {
            st = zr_gpt_engine_micro(&rm->run, e, tok, tok + 1, &loss);
        }
        if (st == ZR_OK) {
            st = zr_engine_step(e, 1e-4f, &stats);
        }
        st = zr_comm_agree(c, st);
        if (st == ZR_OK && k >= 0) {
            /* as zr bench train reports a step: the slowest rank's; the split, the ranks' mean */
            double t[1] = {stats.t_total};
            double split[3] = {stats.t_total - stats.t_comm - stats.t_optim, stats.t_comm,
                               stats.t_optim};
            st = zr_probe_slowest(c, t, 1);
            if (st == ZR_OK) {
                st = zr_comm_allreduce_sum_f64(c, ZR_GROUP_WORLD, split, 3);
            }
            rec[k][0] = t[0];
            for (int j = 0; j < 3; j++) {
                rec[k][j + 1] = split[j] / W;
            }
        }
    }
    return st;
}

/* One block of reference r: a model and an engine built, CAL_WARM steps, CAL_STEPS measured. */
static zr_status reference_block(zr_comm *c, const zr_train_config *cfg, const zr_gpt_config *g,
                                 zr_stream *s, int r, cal_rec *rec)
{
    int B = cfg->train_micro_batch_size_per_gpu, T = cfg->seq_len;
    const zr_gpt_backend_i *be;
    zr_engine_config ecfg;
    ZR_CHECK(reference_engine(cfg, g, r, s, &be, &ecfg));
    ref_model rm;
    zr_engine e;
    zr_gpt_specs sp;
    memset(&sp, 0, sizeof sp);
    int *tok = NULL, engine_up = 0;
    zr_status st = ref_model_init(&rm, c, cfg, g, &ecfg, s);
    if (st == ZR_OK) {
        st = zr_gpt_specs_init(&sp, g);
    }
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(tok, (size_t)B * (size_t)T + 1);
    }
    for (size_t i = 0; st == ZR_OK && i < (size_t)B * (size_t)T + 1; i++) {
        tok[i] = (int)((i * 2654435761u + (size_t)c->rank[ZR_GROUP_WORLD]) % (size_t)g->vocab);
    }
    st = zr_comm_agree(c, st);
    if (st == ZR_OK) {
        st = zr_engine_init(&e, c, &ecfg, sp.nunits, sp.units);
        engine_up = st == ZR_OK;
    }
    if (st == ZR_OK) {
        st = zr_gpt_engine_init_params(&e, g, 1);
    }
    st = zr_comm_agree(c, st);
    if (st == ZR_OK) {
        st = reference_run(c, &rm, &e, tok, rec);
    }
    if (engine_up) {
        zr_engine_free(&e);
    }
    zr_status back = ref_model_free(&rm, c);
    zr_gpt_specs_free(&sp);
    zr_free(tok);
    /* the probe goes on with the communicator on its own stream, every rank's */
    back = zr_comm_agree(c, back);
    return st != ZR_OK ? st : back;
}

/*
 * Whether reference r fits the node (the kernel would kill the job, not fail
 * an allocation) or its device's memory (the backend's model bytes in place
 * of the CPU's activations, without the host's allowance, as the trainer
 * checks them).
 */
static zr_status reference_fits(zr_comm *c, const zr_train_config *cfg, const zr_gpt_config *g,
                                zr_stream *s, int r, const zr_probe *p)
{
    const zr_gpt_backend_i *be;
    zr_engine_config ecfg;
    ZR_CHECK(reference_engine(cfg, g, r, s, &be, &ecfg));
    zr_gpt_shape sh = {cfg->train_micro_batch_size_per_gpu, cfg->seq_len,
                       cfg->activation_checkpointing && be->recompute, ecfg.work_type};
    if (be->check_shape != NULL) {
        ZR_CHECK(be->check_shape(g, &sh));
    }
    /* the probe's memory per rank is the device's where the model lives there */
    zr_gpt_memory_prediction host, dev;
    ZR_CHECK(zr_gpt_engine_predict_on(be, g, &sh, &ecfg, c, &host, &dev));
    double total = (double)(dev.total > 0 ? dev.total : host.total);
    if (total > 0.8 * p->mem_per_rank) {
        ZR_FAIL(ZR_ERR_NOMEM,
                "it needs %.2f GB per rank%s, 0.8 of the %.2f GB available is the limit",
                total / 1e9, dev.total > 0 ? " on the GPU" : "", p->mem_per_rank / 1e9);
    }
    return ZR_OK;
}

/*
 * The references in CAL_BLOCKS rounds, each reference once per round (a
 * drift of the machine during the probe falls on all of them alike), and
 * each figure the median of its CAL_N steps. A reference that does not fit
 * or fails is left out (rank 0 says why): without stage 0's, stages 0-2 are
 * calibrated on ZeRO-3's; without a ZeRO-3 one, no calibration.
 */
void zr_probe_reference_steps(zr_comm *c, const zr_train_config *cfg, const zr_gpt_config *g,
                              zr_stream *s, zr_probe *out)
{
    static const char *const name[3] = {"ZeRO-3", "ZeRO-3 + qwZ + qgZ", "stage 0"};
    cal_rec rec[3][CAL_N];
    int ok[3];
    for (int r = 0; r < 3; r++) {
        ok[r] = reference_fits(c, cfg, g, s, r, out) == ZR_OK;
        if (!ok[r] && c->rank[ZR_GROUP_WORLD] == 0) {
            fprintf(stderr, "zr probe: no reference steps of %s: %s\n", name[r],
                    zr_error_message());
        }
    }
    int rounds = CAL_BLOCKS;
    double t0 = zr_now();
    for (int b = 0; b < rounds; b++) {
        for (int r = 0; r < 3; r++) {
            if (!ok[r] || (r < 2 && !(ok[0] && ok[1]))) {
                continue;
            }
            if (reference_block(c, cfg, g, s, r, rec[r] + b * CAL_STEPS) != ZR_OK) {
                ok[r] = 0; /* agreed: every rank leaves it out */
                if (c->rank[ZR_GROUP_WORLD] == 0) {
                    fprintf(stderr, "zr probe: the reference steps of %s failed: %s\n", name[r],
                            zr_error_message());
                }
            } else if (c->rank[ZR_GROUP_WORLD] == 0) {
                const cal_rec *k = rec[r] + b * CAL_STEPS;
                ZR_INFO("reference %s, round %d: steps %.1f %.1f %.1f ms (comm %.1f %.1f %.1f)",
                        name[r], b + 1, 1e3 * k[0][0], 1e3 * k[1][0], 1e3 * k[2][0], 1e3 * k[0][2],
                        1e3 * k[1][2], 1e3 * k[2][2]);
            }
        }
        /* a model whose steps take seconds: as many rounds as the budget holds at the rate so
           far (a long step varies less, too); every rank decides on the slowest's time */
        double t[1] = {zr_now() - t0};
        if (b + 1 < rounds &&
            (zr_probe_slowest(c, t, 1) != ZR_OK || t[0] * (b + 2) / (b + 1) > CAL_BUDGET_S)) {
            rounds = b + 1;
        }
    }
    int n = rounds * CAL_STEPS;
    if (!(ok[0] && ok[1])) {
        if (c->rank[ZR_GROUP_WORLD] == 0) {
            fprintf(stderr, "zr probe: without ZeRO-3's reference steps the plan rests on the "
                            "measured rates alone\n");
        }
        return; /* cal_batch stays 0 */
    }
    out->cal_batch = cfg->train_micro_batch_size_per_gpu;
    out->cal_prefetch = (double)cfg->stage3_prefetch_bucket_size;
    for (int r = 0; r < 3 && ok[r]; r++) {
        double *f[4] = {&out->cal_step[r], &out->cal_compute[r], &out->cal_comm[r],
                        &out->cal_optim[r]};
        for (int j = 0; j < 4; j++) {
            double v[CAL_N];
            for (int k = 0; k < n; k++) {
                v[k] = rec[r][k][j];
            }
            *f[j] = zr_median(v, n);
        }
    }
}
