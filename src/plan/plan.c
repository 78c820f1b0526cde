/*
 * plan.c - the planner: every configuration the engine can run for the
 * requested global batch on the probe's layout, costed (cost.c), those over
 * the memory limit discarded, the rest ranked by predicted tokens/s.
 *
 * What is enumerated (DeepSpeed leaves each of these to the user):
 *
 *   stage 0, 1, 2, 3
 *   qwZ   off, INT8, INT4                       (stage 3)
 *   hpZ   every divisor h of the ranks per node (stage 3; 1 = off); with one rank
 *         per node also a secondary over a group of one (zero_hpz_partition_size 0)
 *   qgZ   off, INT4, INT8                       (stage 2, 3)
 *   prefetch budget  0, one largest unit, the configuration's value (stage 3)
 *   micro-batch b x accumulation a with b * a * world = the global batch,
 *         b within the micro-batch sizes the probe measured
 *
 * Everything else (model, sequence length, wires, reduce bucket, optimizer)
 * is the user's configuration.
 */
#include "zr/plan.h"

#include "zr/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void zr_plan_describe(const zr_plan_choice *ch, char *buf, size_t n)
{
    char q[96] = "", pre[40] = "";
    size_t k = 0;
    if (ch->qwz) {
        k += (size_t)snprintf(q + k, sizeof q - k, " + qwZ(%d)", ch->qwz_bits);
    }
    if (ch->hpz != 1) {
        k += (size_t)snprintf(q + k, sizeof q - k, " + hpZ(%d)", ch->hpz > 0 ? ch->hpz : 1);
    }
    if (ch->qgz) {
        snprintf(q + k, sizeof q - k, " + qgZ(%d)", ch->qgz_bits);
    }
    if (ch->stage == 3) {
        snprintf(pre, sizeof pre, ", prefetch %.3g", (double)ch->prefetch_bucket);
    }
    snprintf(buf, n, "stage %d%s, micro %d x %d%s", ch->stage, q, ch->micro_batch, ch->accum, pre);
}

/* The choice's settings written into cfg, as the trainer would read them from its file. */
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

/*
 * Whether a ranks before b: faster, then smaller. A tie in both goes to the
 * larger prefetch budget: the cost model lets a posted transfer move during
 * computation at the probe's overlap whatever is queued behind it, and once
 * the link is the bottleneck one unit ahead and all of them price alike;
 * where such a tie was measured (bench/cluster, 1 Gbit/s) the larger budget
 * was the faster, by 3% and 13% (why is a guess, not measured: what is posted
 * early can sit in the kernel's socket buffers, sent while the rank
 * computes, which the probe's overlap of one transfer does not see). The
 * rest of the choice then orders the ties, so the pick never depends on how
 * qsort orders equal entries.
 */
static int better(const zr_plan_entry *a, const zr_plan_entry *b)
{
    if (a->cost.tokens_per_s != b->cost.tokens_per_s) {
        return a->cost.tokens_per_s > b->cost.tokens_per_s;
    }
    if (a->cost.mem.total != b->cost.mem.total) {
        return a->cost.mem.total < b->cost.mem.total;
    }
    const zr_plan_choice *x = &a->choice, *y = &b->choice;
    if (x->prefetch_bucket != y->prefetch_bucket) {
        return x->prefetch_bucket > y->prefetch_bucket;
    }
    const int u[] = {x->stage, x->qwz, x->qwz_bits, x->hpz, x->qgz, x->qgz_bits, x->micro_batch},
              v[] = {y->stage, y->qwz, y->qwz_bits, y->hpz, y->qgz, y->qgz_bits, y->micro_batch};
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        if (u[i] != v[i]) {
            return u[i] < v[i];
        }
    }
    return 0;
}

static int cmp_entry(const void *x, const void *y)
{
    const zr_plan_entry *a = x, *b = y;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/*
 * The candidates for one micro-batch split, appended to list (room for all).
 * Quantization is never coarser than the configuration's bits: a faster step
 * is no gain if the model trains worse, and ZeRO++'s pre-training results
 * hold for INT8 weights and INT4 gradients (zr's defaults), while 4-bit
 * weights were shown for fine-tuning only. zr.quant.qwz_bits 4 opts in.
 * One rank (W 1) gets stage 0 only: its shard is the whole model, so stages
 * 1-3 hold the same state with more copies, and qwZ / qgZ only round what is
 * never sent. Priced, they came within the probe's noise of stage 0 and one
 * probe ranked stage 2 + qgZ first, a lossy pick for nothing.
 */
static int enumerate(const zr_train_config *cfg, int W, const int *hs, int nh, size_t big_unit,
                     int b, int a, zr_plan_choice *list)
{
    static const int qbits[] = {0, 8, 4};
    long long pre[3] = {0, (long long)big_unit, cfg->stage3_prefetch_bucket_size};
    int n = 0;
    for (int stage = 0; stage <= (W == 1 ? 0 : 3); stage++) {
        for (int wq = 0; wq < 3; wq++) {
            for (int hi = 0; hi < nh; hi++) {
                int h = hs[hi];
                for (int gq = 0; gq < 3; gq++) {
                    for (int p = 0; p < 3; p++) {
                        int gbits = gq == 1 ? 4 : gq == 2 ? 8 : 0;
                        if ((stage < 3 && (wq || h != 1 || p)) || (stage < 2 && gq) ||
                            (p == 2 && pre[2] <= pre[1]) || (wq && qbits[wq] < cfg->qwz_bits) ||
                            (gq && gbits < cfg->qgz_bits)) {
                            continue;
                        }
                        list[n++] = (zr_plan_choice){stage, wq > 0, qbits[wq], h, gq > 0,
                                                     gbits, pre[p], b,         a};
                    }
                }
            }
        }
    }
    return n;
}

/*
 * The hpZ groups to try, ascending: 0 (a secondary over a group of one) with
 * one rank per node, then every divisor of D, found up to its square root:
 * the work grows with the divisors' count, never with D (hs holds
 * hpz_groups_max(D)).
 */
static int hpz_groups_max(int D)
{
    int r = 1;
    while ((long long)r * r <= D) {
        r++;
    }
    return 2 * r + 1;
}

static int hpz_groups(int D, int *hs)
{
    int n = 0;
    if (D == 1) {
        hs[n++] = 0;
    }
    int small = n;
    for (int d = 1; (long long)d * d <= D; d++) {
        if (D % d == 0) {
            hs[n++] = d;
        }
    }
    for (int i = n - 1; i >= small; i--) {
        if (hs[i] != D / hs[i]) {
            hs[n++] = D / hs[i];
        }
    }
    return n;
}

static void explain(zr_plan_result *r, int W)
{
    const zr_plan_entry *w = &r->entries[0];
    char d[160];
    zr_plan_describe(&w->choice, d, sizeof d);
    const zr_plan_entry *z3 = NULL, *next = r->n > 1 ? &r->entries[1] : NULL;
    for (int i = 0; i < r->n && z3 == NULL; i++) {
        const zr_plan_choice *c = &r->entries[i].choice;
        if (c->stage == 3 && !c->qwz && c->hpz == 1 && !c->qgz &&
            c->micro_batch == w->choice.micro_batch) {
            z3 = &r->entries[i];
        }
    }
    const zr_plan_cost *k = &w->cost;
    size_t n = (size_t)snprintf(
        r->why, sizeof r->why,
        "%s wins: %.0f tokens/s predicted, step %.1f ms = compute %.1f + codecs %.1f + exposed "
        "comm %.1f + optimizer %.1f; %.2f MB across nodes per rank and step",
        d, k->tokens_per_s, 1e3 * k->t_step, 1e3 * k->t_compute, 1e3 * k->t_codec,
        1e3 * k->t_exposed, 1e3 * k->t_optim, k->bytes_inter / 1e6);
    if (z3 != NULL && z3 != w && n < sizeof r->why) {
        n +=
            (size_t)snprintf(r->why + n, sizeof r->why - n, " (ZeRO-3 bf16: %.2f MB, %.2fx slower)",
                             z3->cost.bytes_inter / 1e6, k->tokens_per_s / z3->cost.tokens_per_s);
    }
    if (next != NULL && n < sizeof r->why) {
        zr_plan_describe(&next->choice, d, sizeof d);
        snprintf(r->why + n, sizeof r->why - n, "; next best %s is %.1f%% slower", d,
                 100.0 * (1.0 - next->cost.tokens_per_s / k->tokens_per_s));
    }
    n = strlen(r->why);
    if (W == 1 && n < sizeof r->why) {
        snprintf(r->why + n, sizeof r->why - n,
                 "; one rank: stage 0 only (nothing to shard or send, quantizing would only "
                 "round the model)");
    }
}

/* The probe's figures are one device's: the run must compute where they were measured. */
static zr_status check_device(const zr_train_config *cfg, const zr_probe *probe)
{
    int cpu = strcmp(cfg->device, "cpu") == 0, cuda = strcmp(cfg->device, "cuda") == 0;
    if ((probe->gpu && cpu) || (!probe->gpu && cuda)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the probe measured %s, but zr.device is %s: probe again with the run's zr.device",
                probe->gpu ? "GPUs" : "the CPU", cfg->device);
    }
    if (probe->gpu && probe->bf16 != (cfg->bf16_enabled != 0)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the probe measured %s compute on the GPUs, but bf16.enabled is %s: probe again "
                "with the run's bf16.enabled",
                probe->bf16 ? "bf16" : "fp32", cfg->bf16_enabled ? "true" : "false");
    }
    return ZR_OK;
}

/*
 * The probe's figures are of the model it ran: a unit's time depends on the
 * architecture, the width, the heads, the sequence, the vocabulary, the
 * Llama family's fields, the threads and the recomputation. The depth alone
 * may differ (a probe of a shallower model costs less): the blocks are
 * priced one by one, and the calibration prices the probe's reference steps
 * at the depth they ran.
 */
static zr_status check_arch(const zr_probe *p, const zr_gpt_config *m)
{
    static const char *const name[2] = {"GPT-2", "a Llama-family model"};
    if (p->arch != (int)m->arch) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the probe measured another model: %s there, %s here (zr.model.init %s); probe "
                "again with this run's model",
                name[p->arch != 0], name[m->arch != ZR_ARCH_GPT2],
                m->arch == ZR_ARCH_GPT2 ? "is not a Hugging Face folder"
                                        : "is a Hugging Face folder");
    }
    return ZR_OK;
}

static zr_status check_model(const zr_train_config *cfg, int vocab, const zr_probe *p)
{
    zr_gpt_config m;
    ZR_CHECK(zr_plan_model(cfg, vocab, &m));
    ZR_CHECK(check_arch(p, &m));
    const zr_llama_config *l = &m.llama;
    const struct {
        const char *key;
        int probe, run;
    } k[] = {
        {"zr.model.channels", p->channels, cfg->channels},
        {"zr.model.heads", p->heads, cfg->heads},
        {"zr.model.seq_len", p->seq_len, cfg->seq_len},
        {"zr.model.max_seq_len", p->max_seq_len, cfg->max_seq_len},
        {"zr.model.vocab_size (or the data's)", p->vocab, vocab},
        {"the model's num_key_value_heads", p->kv_heads, l->kv_heads},
        {"the model's head_dim", p->head_dim, l->head_dim},
        {"the model's intermediate_size", p->intermediate, l->intermediate},
        {"the model's tie_word_embeddings", p->tied, l->tied},
        {"the model's q/k/v biases", p->qkv_bias, l->qkv_bias},
        {"zr.model.activation_checkpointing", p->recompute, cfg->activation_checkpointing != 0},
        {"zr.train.threads", p->gpu ? cfg->threads : p->threads, cfg->threads},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        if (k[i].probe != k[i].run) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "the probe measured another model: %s is %d there, %d here; probe again "
                    "with this run's model",
                    k[i].key, k[i].probe, k[i].run);
        }
    }
    return ZR_OK;
}

zr_status zr_plan_check_probe(const zr_train_config *cfg, int vocab, const zr_probe *probe)
{
    ZR_CHECK(check_device(cfg, probe));
    return check_model(cfg, vocab, probe);
}

/* The calibration on the probe's reference steps, which ran the probe's own depth. */
static zr_status calibrate(const zr_train_config *cfg, int vocab, const zr_probe *probe,
                           zr_plan_calibration *out)
{
    zr_train_config *at = NULL;
    ZR_ALLOC(at, 1);
    *at = *cfg;
    at->layers = probe->layers;
    zr_status st = zr_plan_calibrate(at, vocab, probe, out);
    zr_free(at);
    out->layers = probe->layers;
    return st;
}

/* At most ZR_PLAN_MAX_WORLD ranks (the plan's work does not grow with them, but a world no
   machine has is a damaged file), as nodes x ranks per node. */
static zr_status check_layout(const zr_probe *probe)
{
    int N = probe->nodes, D = probe->ranks_per_node;
    if (probe->world < 1 || probe->world > ZR_PLAN_MAX_WORLD) {
        ZR_FAIL(ZR_ERR_INVALID, "the probe's world (%d ranks) is outside 1..%d (2^24)",
                probe->world, ZR_PLAN_MAX_WORLD);
    }
    if (N < 1 || D < 1 || N > probe->world / D || N * D != probe->world) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the probe's layout (%d nodes x %d ranks, world %d) is not one the "
                "engine can run",
                N, D, probe->world);
    }
    return ZR_OK;
}

zr_status zr_plan_run(const zr_train_config *cfg, int vocab, const zr_probe *probe,
                      double mem_limit, zr_plan_result *out)
{
    memset(out, 0, sizeof *out);
    int N = probe->nodes, D = probe->ranks_per_node, W = probe->world;
    ZR_CHECK(check_layout(probe));
    ZR_CHECK(zr_plan_check_probe(cfg, vocab, probe));
    ZR_CHECK(calibrate(cfg, vocab, probe, &out->cal));
    long long G = cfg->train_batch_size;
    if (G < 1 || G % W != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the global batch (train_batch_size %lld) cannot be split evenly over %d ranks; "
                "give a multiple of %d",
                G, W, W);
    }
    long long per = G / W;
    int bmax = probe->compute[probe->ncompute - 1].batch;
    int splits = 0;
    for (long long b = 1; b <= per && b <= bmax; b++) {
        splits += per % b == 0;
    }
    if (splits == 0) {
        ZR_FAIL(ZR_ERR_INVALID, "no micro-batch fits: train_batch_size %lld over %d ranks", G, W);
    }
    zr_gpt_config m;
    ZR_CHECK(zr_plan_model(cfg, vocab, &m));
    size_t big = 0;
    for (int u = 0; u < zr_gpt_config_unit_count(&m); u++) {
        size_t p = zr_zero_padded(zr_gpt_config_unit_numel(&m, u), W);
        big = p > big ? p : big;
    }
    int *hs = NULL;
    ZR_ALLOC(hs, (size_t)hpz_groups_max(D));
    int nh = hpz_groups(D, hs);
    size_t cap = (size_t)splits * (2 + 3 + 3 * 3 * (size_t)nh * 3);
    zr_plan_choice *list = NULL;
    zr_status st = ZR_OK;
    ZR_ALLOC_GOTO(list, cap, st, fail);
    ZR_ALLOC_GOTO(out->entries, cap, st, fail);
    double min_mem = INFINITY;
    int n = 0;
    for (long long b = 1; b <= per && b <= bmax; b++) {
        if (per % b == 0) {
            n += enumerate(cfg, W, hs, nh, big, (int)b, (int)(per / b), list + n);
        }
    }
    ZR_ASSERT((size_t)n <= cap);
    for (int i = 0; i < n; i++) {
        zr_plan_entry *e = &out->entries[out->n];
        e->choice = list[i];
        ZR_CHECK_GOTO(
            zr_plan_cost_calibrated(cfg, vocab, N, D, &list[i], probe, &out->cal, &e->cost), st,
            fail);
        out->considered++;
        min_mem = fmin(min_mem, (double)e->cost.mem.total);
        if (mem_limit > 0 && (double)e->cost.mem.total > mem_limit) {
            out->over_memory++;
            continue;
        }
        out->n++;
    }
    if (out->n == 0) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_INVALID,
                     "no configuration fits the memory limit of %.2f GB per rank: the smallest of "
                     "the %d considered needs %.2f GB (a smaller micro-batch, activation "
                     "checkpointing or more ranks would help)",
                     mem_limit / 1e9, out->considered, min_mem / 1e9);
    }
    zr_free(list);
    zr_free(hs);
    qsort(out->entries, (size_t)out->n, sizeof *out->entries, cmp_entry);
    explain(out, W);
    return ZR_OK;
fail:
    zr_free(list);
    zr_free(hs);
    zr_plan_result_free(out);
    return st;
}

double zr_plan_link_shrink(const zr_plan_calibration *cal)
{
    double shrink = 1;
    const zr_plan_calib *f[2] = {&cal->stage3, &cal->stage012};
    for (int i = 0; i < 2 && cal->calibrated; i++) {
        if (f[i]->t_sync == 0 && f[i]->k_comm < shrink) {
            shrink = f[i]->k_comm;
        }
    }
    return shrink;
}

void zr_plan_result_free(zr_plan_result *r)
{
    zr_free(r->entries);
    memset(r, 0, sizeof *r);
}
