/*
 * trainer.c - the training loop: how one step of zr happens, top to bottom.
 *
 *   init     configuration -> communicator (hpZ group), data, model shape,
 *            loaders, sizes checked against this node's memory, model,
 *            engine, parameters (zr.model.init or the seed), checkpoint dir
 *            locked and cleared of a crashed save's leftovers
 *   resume   the newest intact checkpoint (or --resume-from): engine state
 *            resharded to this world size, loader placed by the token count
 *   step     gradient_accumulation_steps micro-batches through the engine,
 *            one engine step at the scheduled rate, one control all-reduce
 *            (loss, bytes, stop request, a failed metrics write), validation
 *            when due, the metrics line, divergence check, checkpoint when
 *            due or when a stop was requested
 *   finish   the final checkpoint and the run's totals
 *
 * Every decision that could differ between ranks (a file that one node
 * cannot read, a signal that reached one rank) is agreed on collectively, so
 * an error ends every rank with the same message and a stop request stops
 * every rank after the same step. Nothing is printed here: rank 0's notices
 * go to the caller's note callback, each step's numbers to its record.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/trainer.h"

#include "zr/launch.h"
#include "zr/schedule.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

/* Rank 0's notice to the caller, formatted. */
__attribute__((format(printf, 3, 4))) static void note(const zr_trainer *t, zr_log_level level,
                                                       const char *fmt, ...)
{
    if (t->rank != 0 || t->note == NULL) {
        return;
    }
    char msg[2 * ZR_PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    t->note(t->note_ctx, level, msg);
}

/* Checkpoint-dir warnings (leftovers, set-aside checkpoints) from rank 0. */
static void warn_ckpt(void *ctx, const char *msg)
{
    note((const zr_trainer *)ctx, ZR_LOG_WARN, "%s", msg);
}

/* ---- configuration -> engine and schedule --------------------------------------- */

zr_engine_config zr_trainer_engine_config(const zr_train_config *c)
{
    zr_engine_config e = zr_engine_config_default();
    e.stage = c->stage;
    zr_wire_type wire =
        strcmp(c->communication_data_type, "fp32") == 0 ? ZR_WIRE_F32 : ZR_WIRE_BF16;
    e.param_wire.type = wire;
    e.grad_wire.type = wire;
    e.qwz = c->zero_quantized_weights;
    e.qwz_q = (zr_qparams){c->qwz_bits, c->qwz_group, ZR_QSYM};
    e.hpz = c->zero_hpz_partition_size != 1;
    e.qgz = c->zero_quantized_gradients;
    e.qgz_cfg.q = (zr_qparams){c->qgz_bits, c->qgz_group, ZR_QSYM};
    e.qgz_cfg.chunks = c->qgz_chunks;
    e.qgz_cfg.error_feedback = c->qgz_error_feedback;
    e.overlap = c->overlap_comm;
    size_t live = (size_t)c->stage3_max_live_parameters;
    e.max_live = live > 0 ? live : (size_t)-1;
    e.prefetch_bucket = (size_t)c->stage3_prefetch_bucket_size;
    e.reduce_bucket = (size_t)c->reduce_bucket_size;
    e.beta1 = (float)c->beta1;
    e.beta2 = (float)c->beta2;
    e.eps = (float)c->eps;
    e.weight_decay = (float)c->weight_decay;
    e.grad_clip = (float)c->gradient_clipping;
    return e;
}

/* The scheduler section as a schedule, built once (src/optim/schedule.c has the formulas). */
static zr_status schedule_of(const zr_train_config *c, zr_lr_schedule *s)
{
    memset(s, 0, sizeof *s);
    ZR_CHECK(zr_lr_kind_parse(c->scheduler_type, &s->kind));
    ZR_CHECK(zr_lr_warmup_parse(c->warmup_type, &s->warmup));
    s->lr = c->lr;
    s->warmup_min_lr = c->warmup_min_lr;
    s->warmup_max_lr = c->warmup_max_lr;
    s->warmup_num_steps = c->warmup_num_steps;
    s->total_num_steps = c->total_num_steps;
    s->warmup_min_ratio = c->warmup_min_ratio;
    s->cos_min_ratio = c->cos_min_ratio;
    return ZR_OK;
}

/* ---- set-up ---------------------------------------------------------------------- */

static zr_status load_data(zr_trainer *t)
{
    const zr_train_config *c = &t->cfg;
    if (c->data_path[0] == '\0') {
        ZR_CHECK(zr_dataset_load_fortunes(&t->data, ZR_FORTUNES_DIR));
        return zr_dataset_set_vocab(&t->data, "the bundled corpus", c->vocab_size);
    }
    /* what the file is (llm.c shard of either kind, or text) comes from its content */
    return zr_dataset_load(&t->data, c->data_path, c->vocab_size);
}

/*
 * The model's shape: from the configuration, or from the llm.c model file of
 * zr.model.init, whose shape the keys given must match and whose vocabulary
 * the data must have been tokenised for.
 */
static zr_status model_shape(zr_trainer *t)
{
    zr_train_config *c = &t->cfg;
    int V = t->data.vocab;
    if (c->init_path[0] == '\0') {
        t->mcfg = (zr_gpt_config){c->max_seq_len, V,        (int)zr_round_up((size_t)V, 128),
                                  c->layers,      c->heads, c->channels};
        return ZR_OK;
    }
    zr_gpt_config fc;
    ZR_CHECK(zr_gpt_read_llmc_config(c->init_path, &fc));
    ZR_CHECK(zr_config_adopt_model(c, &fc, c->init_path));
    if (V != fc.vocab) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s (zr.data.path) is %s with a vocabulary of %d tokens, but the model file %s "
                "(zr.model.init) has %d; train it on data tokenised for it (an llm.c GPT-2 token "
                "shard for GPT-2 weights), or set zr.model.vocab_size to %d if these tokens are "
                "meant for it",
                c->data_path[0] ? c->data_path : "the bundled corpus",
                zr_data_kind_name(t->data.kind), V, c->init_path, fc.vocab, fc.vocab);
    }
    t->mcfg = fc;
    return ZR_OK;
}

/*
 * Sizes that are valid one by one but would cost hours, or more memory than
 * the node has, before the first step could report anything are refused
 * here, naming their keys (every key at its extreme either fails here or
 * costs nothing until used).
 */
static zr_status check_sizes(zr_trainer *t)
{
    const zr_train_config *c = &t->cfg;
    size_t train_batches = zr_loader_batches_per_epoch(&t->train);
    size_t val_batches = zr_loader_batches_per_epoch(&t->val);
    double global = (double)t->world * c->train_micro_batch_size_per_gpu * c->seq_len;
    if (c->val_every > 0 && (size_t)c->val_batches > val_batches) {
        ZR_FAIL(
            ZR_ERR_INVALID,
            "zr.data.val_batches (%d) is more than the %zu batches of %.0f tokens (%d ranks x "
            "train_micro_batch_size_per_gpu %d x zr.model.seq_len %d) that the validation split "
            "holds; each pass would read the same tokens again: use at most %zu (or "
            "zr.data.val_every 0 for no validation)",
            c->val_batches, val_batches, global, t->world, c->train_micro_batch_size_per_gpu,
            c->seq_len, val_batches);
    }
    if ((size_t)c->gradient_accumulation_steps > train_batches) {
        ZR_FAIL(ZR_ERR_INVALID,
                "one optimizer step (gradient_accumulation_steps %d x %.0f tokens) reads more than "
                "the whole training split (%zu batches of %.0f tokens): lower "
                "gradient_accumulation_steps or train_batch_size to at most %zu batches",
                c->gradient_accumulation_steps, global, train_batches, global, train_batches);
    }
    /* a lower bound of what one rank allocates: activations (layout of src/model/gpt.c) and
       the fp32 model state (master, gradient, Adam m and v, sharded; the full parameters
       below stage 3) */
    const zr_gpt_config *m = &t->mcfg;
    double BT = (double)c->train_micro_batch_size_per_gpu * c->seq_len, C = m->channels;
    double acts = 4.0 * (BT * (m->layers * (16.0 * C + 4.0 + (double)m->heads * c->seq_len) +
                               10.0 * C + m->padded_vocab + 3.0) +
                         128.0 * c->seq_len);
    double params = (double)zr_gpt_config_param_count(m);
    double state = 16.0 * params / t->world + (c->stage < 3 ? 4.0 * params : 0.0);
    struct sysinfo si;
    double have =
        sysinfo(&si) == 0 ? ((double)si.totalram + (double)si.totalswap) * si.mem_unit : INFINITY;
    int per_node = t->comm.ranks_per_node > 0 ? t->comm.ranks_per_node : 1;
    if ((acts + state) * per_node > have) {
        ZR_FAIL(ZR_ERR_INVALID,
                "this run needs at least %.1f GB per node (%d rank%s x (%.1f GB of activations "
                "for train_micro_batch_size_per_gpu %d x zr.model.seq_len %d with zr.model.layers "
                "%d, zr.model.channels %d, zr.model.heads %d + %.1f GB of model state for %.0f "
                "parameters)), more than the %.1f GB of memory and swap of this node: lower "
                "those keys",
                (acts + state) * per_node / 1e9, per_node, per_node == 1 ? "" : "s", acts / 1e9,
                c->train_micro_batch_size_per_gpu, c->seq_len, m->layers, m->channels, m->heads,
                state / 1e9, params, have / 1e9);
    }
    return ZR_OK;
}

/* The number after key in a /proc file ("MemAvailable:" in kB, or the first field of statm). */
static int proc_number(const char *path, const char *key, double *out)
{
    FILE *f = NULL;
    if (zr_file_open_read(path, &f) != ZR_OK) {
        zr_error_clear();
        return 0;
    }
    char line[256];
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        size_t n = strlen(key);
        if (strncmp(line, key, n) == 0) {
            found = sscanf(line + n, "%lf", out) == 1;
        }
    }
    fclose(f);
    return found;
}

/*
 * The predicted peak per rank (zr_gpt_engine_predict), printed by rank 0 and
 * checked before the model and the engine allocate anything: against this
 * process's address-space limit (RLIMIT_AS, counting what is mapped already)
 * and against this rank's share of the node's available memory. A run that
 * cannot fit is refused up front, on every rank, instead of being killed by
 * the OOM killer or failing an allocation mid-run.
 */
static zr_status check_memory(zr_trainer *t)
{
    const zr_train_config *c = &t->cfg;
    zr_engine_config ecfg = zr_trainer_engine_config(c);
    zr_gpt_memory_prediction p;
    ZR_CHECK(zr_gpt_engine_predict(&t->mcfg, c->train_micro_batch_size_per_gpu, c->seq_len,
                                   c->activation_checkpointing, &ecfg, &t->comm, &p));
    const double GB = 1e9;
    note(t, ZR_LOG_INFO,
         "memory: predicted peak per rank %.2f GB = model state %.2f + activations %.2f + "
         "engine buffers %.2f (bounded by the live-parameter, prefetch and reduce buckets) + "
         "allowance %.2f",
         p.total / GB, p.state / GB, p.activations / GB, p.pool / GB, p.allowance / GB);
    struct rlimit rl;
    double mapped_pages = 0;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        proc_number("/proc/self/statm", "", &mapped_pages)) {
        double mapped = mapped_pages * (double)sysconf(_SC_PAGESIZE);
        /* what zr will map: everything but the allowance, which is mapped already */
        double need = mapped + (double)(p.total - p.allowance);
        if (need > (double)rl.rlim_cur) {
            ZR_FAIL(ZR_ERR_NOMEM,
                    "needs %.2f GB, limit %.2f GB (RLIMIT_AS; %.2f GB mapped before the "
                    "model, predicted %.2f GB of model state for zero_optimization.stage %d over "
                    "%d ranks, %.2f GB of activations, %.2f GB of engine buffers): use more ranks, "
                    "a higher stage, activation checkpointing, or smaller reduce/prefetch buckets",
                    need / GB, (double)rl.rlim_cur / GB, mapped / GB, p.state / GB, c->stage,
                    t->world, p.activations / GB, p.pool / GB);
        }
    }
    double avail_kb = 0;
    if (proc_number("/proc/meminfo", "MemAvailable:", &avail_kb)) {
        int per_node = t->comm.ranks_per_node > 0 ? t->comm.ranks_per_node : 1;
        double share = avail_kb * 1024.0 / per_node;
        if ((double)p.total > share) {
            ZR_FAIL(ZR_ERR_NOMEM,
                    "needs %.2f GB, limit %.2f GB (this node's available memory %.2f GB "
                    "shared by %d rank%s; predicted %.2f GB of model state for "
                    "zero_optimization.stage %d over %d ranks, %.2f GB of activations, %.2f GB of "
                    "engine buffers): use more nodes, a higher stage, or activation checkpointing",
                    (double)p.total / GB, share / GB, avail_kb * 1024.0 / GB, per_node,
                    per_node == 1 ? "" : "s", p.state / GB, c->stage, t->world, p.activations / GB,
                    p.pool / GB);
        }
    }
    return ZR_OK;
}

static zr_status setup(zr_trainer *t)
{
    zr_train_config *c = &t->cfg;
    ZR_CHECK(zr_comm_agree(&t->comm, load_data(t)));
    ZR_CHECK(zr_launch_check_data(&t->comm, &t->data, t->cfg.data_path));
    ZR_CHECK(zr_comm_agree(&t->comm, model_shape(t)));
    int B = c->train_micro_batch_size_per_gpu, T = c->seq_len;
    zr_status st = zr_loader_init(&t->train, &t->data, ZR_SPLIT_TRAIN, B, T, t->rank, t->world);
    if (st == ZR_OK) {
        st = zr_loader_init(&t->val, &t->data, ZR_SPLIT_VAL, B, T, t->rank, t->world);
    }
    if (st != ZR_OK) {
        /* the loader speaks of B and T; the user set them as keys */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zr_error_message());
        st = zr_error_at(st, __FILE__, __LINE__,
                         "%s (data %s): lower train_micro_batch_size_per_gpu (%d) or "
                         "zr.model.seq_len (%d)",
                         msg, c->data_path[0] ? c->data_path : "the bundled corpus", B, T);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    ZR_CHECK(zr_comm_agree(&t->comm, check_sizes(t)));
    ZR_CHECK(zr_comm_agree(&t->comm, check_memory(t)));
    st = zr_gpt_init_ex(&t->model, &t->mcfg, B, T, c->activation_checkpointing);
    if (st == ZR_OK) {
        st = zr_gpt_specs_init(&t->specs, &t->mcfg);
    }
    if (st == ZR_OK) {
        st = zr_alloc_at((void **)&t->inputs, sizeof(int) * (size_t)B * T, __FILE__, __LINE__);
    }
    if (st == ZR_OK) {
        st = zr_alloc_at((void **)&t->targets, sizeof(int) * (size_t)B * T, __FILE__, __LINE__);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    zr_engine_config ecfg = zr_trainer_engine_config(c);
    ZR_CHECK(zr_engine_init(&t->engine, &t->comm, &ecfg, t->specs.nunits, t->specs.units));
    t->engine_up = 1;
    return ZR_OK;
}

/* ---- checkpoints ------------------------------------------------------------------ */

/*
 * The newest checkpoint failed to load (st): point at the newest intact one
 * before it and at the flag that resumes from it. Rank 0 searches (it reads
 * every file of the candidates); the result is broadcast so that every rank
 * holds the same message, without agreeing twice on one error.
 */
static zr_status damaged_hint(zr_trainer *t, const char *bad, int64_t bad_step, zr_status st)
{
    char alt[ZR_PATH_MAX + 8] = "";
    if (t->rank == 0) {
        char msg[1100];
        snprintf(msg, sizeof msg, "%s", zr_error_message());
        int found = 0;
        if (zr_ckpt_find_intact(t->cfg.checkpoint_dir, bad_step, alt + 1, sizeof alt - 1, &found) !=
                ZR_OK ||
            !found) {
            alt[1] = '\0';
        }
        alt[0] = 1; /* the buffer is valid */
        zr_error_set_message(msg);
    }
    if (zr_comm_bcast(&t->comm, alt, sizeof alt, 0) != ZR_OK) {
        return st;
    }
    char msg[1100 + 2 * sizeof alt];
    if (alt[1] != '\0') {
        snprintf(msg, sizeof msg,
                 "%s\n  the newest intact checkpoint is %s: continue from it with --resume-from "
                 "%s (newer checkpoints are moved aside, not deleted)",
                 zr_error_message(), alt + 1, alt + 1);
    } else {
        snprintf(msg, sizeof msg, "%s\n  %s holds no intact checkpoint older than %s",
                 zr_error_message(), t->cfg.checkpoint_dir, bad);
    }
    /* the load's message was agreed on (it names its rank); so is the hint, so a later
       agreement must not prefix it again */
    zr_error_set_agreed(msg);
    return st;
}

/* Step number of a checkpoint path ("<dir>/step_00000040" -> 40), -1 if unknown. */
static int64_t step_of(const char *path)
{
    const char *base = strrchr(path, '/');
    long long s = -1;
    char tail;
    if (sscanf(base != NULL ? base + 1 : path, "step_%lld%c", &s, &tail) != 1) {
        return -1;
    }
    return s;
}

/*
 * Restore from --resume-from or the newest complete checkpoint; *start =
 * first step to run.
 */
static zr_status resume_at(zr_trainer *t, int *start)
{
    char path[ZR_PATH_MAX];
    int found = 0, explicit = t->cfg.resume_from[0] != '\0';
    *start = 0;
    zr_status st = ZR_OK;
    if (explicit) {
        snprintf(path, sizeof path, "%s", t->cfg.resume_from);
        found = 1;
    } else {
        st = zr_ckpt_find_latest(t->cfg.checkpoint_dir, path, sizeof path, &found);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    if (!found) {
        note(t, ZR_LOG_WARN, "no complete checkpoint in %s; starting from step 0",
             t->cfg.checkpoint_dir);
        return ZR_OK;
    }
    zr_ckpt_meta meta;
    st = zr_ckpt_read_meta(path, &meta);
    if (st == ZR_OK && memcmp(&meta.model, &t->mcfg, sizeof meta.model) != 0) {
        st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                         "checkpoint %s is for another model shape (L=%d NH=%d C=%d V=%d "
                         "max_seq_len=%d); this run has L=%d NH=%d C=%d V=%d max_seq_len=%d; "
                         "resume with the checkpoint's values (e.g. --layers %d --heads %d "
                         "--channels %d --max-seq-len %d; checkpoints written before "
                         "zr.model.max_seq_len existed have max_seq_len = seq_len)",
                         path, meta.model.layers, meta.model.heads, meta.model.channels,
                         meta.model.vocab, meta.model.max_t, t->mcfg.layers, t->mcfg.heads,
                         t->mcfg.channels, t->mcfg.vocab, t->mcfg.max_t, meta.model.layers,
                         meta.model.heads, meta.model.channels, meta.model.max_t);
    }
    if (st == ZR_OK && meta.step > INT_MAX) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "checkpoint %s is at step %lld, beyond the last step zr train can run "
                         "(%d)",
                         path, (long long)meta.step, INT_MAX);
    }
    st = zr_comm_agree(&t->comm, st);
    if (st == ZR_OK) {
        st = zr_ckpt_load(&t->comm, &t->engine, path, &meta);
    }
    if (st == ZR_ERR_FORMAT || st == ZR_ERR_IO) {
        return explicit ? st : damaged_hint(t, path, step_of(path), st);
    }
    ZR_CHECK(st);
    if (explicit && t->cfg.checkpoint_dir[0] != '\0') {
        /* later checkpoints would collide with this run's saves */
        st = t->rank == 0 ? zr_ckpt_set_aside_after(t->cfg.checkpoint_dir, meta.step, warn_ckpt, t)
                          : ZR_OK;
        ZR_CHECK(zr_comm_agree(&t->comm, st));
    }
    /* the loader counts global micro-batches, whose size may differ after resharding;
       the token count places it at the same point of the data either way */
    uint64_t global_tokens =
        (uint64_t)t->world * t->cfg.train_micro_batch_size_per_gpu * t->cfg.seq_len;
    zr_loader_seek(&t->train, meta.tokens / global_tokens);
    *start = (int)meta.step;
    note(t, ZR_LOG_INFO, "resumed from %s (step %lld, saved at %d ranks, now %d)", path,
         (long long)meta.step, meta.world, t->world);
    if (meta.step >= t->cfg.train_steps) {
        note(t, ZR_LOG_INFO,
             "the checkpoint is at or past zr.train.train_steps (%d); nothing to train",
             t->cfg.train_steps);
    }
    return ZR_OK;
}

static zr_status save(zr_trainer *t, int step, char *path, size_t len)
{
    zr_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.step = step;
    meta.optim_steps = t->engine.step;
    meta.tokens = zr_loader_position(&t->train) * (uint64_t)t->world *
                  t->cfg.train_micro_batch_size_per_gpu * t->cfg.seq_len;
    meta.seed = t->cfg.seed;
    meta.stage = t->cfg.stage;
    meta.model = t->mcfg;
    return zr_ckpt_save(&t->comm, &t->engine, t->cfg.checkpoint_dir, &meta, t->config_json,
                        t->cfg.keep_checkpoints, path, len);
}

/* ---- one step --------------------------------------------------------------------- */

static zr_status validate(zr_trainer *t, float *loss)
{
    zr_loader_seek(&t->val, 0);
    double sum = 0.0;
    for (int i = 0; i < t->cfg.val_batches; i++) {
        float l;
        zr_loader_next(&t->val, t->inputs, t->targets);
        ZR_CHECK(zr_gpt_engine_eval(&t->model, &t->engine, t->inputs, t->targets, &l));
        sum += l;
    }
    ZR_CHECK(zr_comm_allreduce_sum_f64(&t->comm, ZR_GROUP_WORLD, &sum, 1));
    *loss = (float)(sum / ((double)t->world * t->cfg.val_batches));
    return ZR_OK;
}

static uint64_t sum_bytes(const zr_traffic *t, int inter)
{
    uint64_t s = 0;
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        s += inter ? t->kind[k].bytes_inter : t->kind[k].bytes_intra;
    }
    return s;
}

/* Rank 0's first failed metrics write, made every rank's error (one collective). */
static zr_status metrics_agree(zr_trainer *t)
{
    zr_status st = t->metrics_st;
    if (st != ZR_OK) {
        zr_error_set_message(t->metrics_err);
    }
    return zr_comm_agree(&t->comm, st);
}

/* Rank 0: one metrics line; a failure is kept until the next collective reports it. */
static void write_metrics(zr_trainer *t, int done, float loss, float lr, const zr_step_stats *st,
                          double tps, double compute, const double *v, int do_val, float val_loss)
{
    if (t->metrics.f == NULL || t->metrics_st != ZR_OK) {
        return;
    }
    zr_metrics_line l;
    zr_metrics_line_begin(&l, done);
    zr_metrics_line_f32(&l, "loss", loss);
    zr_metrics_line_f32(&l, "lr", lr);
    zr_metrics_line_f64(&l, "grad_norm", st->grad_norm);
    zr_metrics_line_f64(&l, "tokens_per_s", tps);
    zr_metrics_line_f64(&l, "t_step", st->t_total);
    zr_metrics_line_f64(&l, "t_compute", compute);
    zr_metrics_line_f64(&l, "t_comm", st->t_comm);
    zr_metrics_line_f64(&l, "t_optim", st->t_optim);
    zr_metrics_line_i64(&l, "bytes_intra", (long long)v[1]);
    zr_metrics_line_i64(&l, "bytes_inter", (long long)v[2]);
    zr_metrics_line_i64(&l, "zero3_bytes_inter", (long long)v[3]);
    zr_metrics_line_i64(&l, "skipped", st->skipped);
    if (do_val) {
        zr_metrics_line_f32(&l, "val_loss", val_loss);
    }
    t->metrics_st = zr_metrics_append(&t->metrics, zr_metrics_line_end(&l));
    if (t->metrics_st != ZR_OK) {
        snprintf(t->metrics_err, sizeof t->metrics_err, "%s", zr_error_message());
    }
}

/* Rank 0 opens the metrics file; a resumed run first cuts it back to its checkpoint's step. */
static zr_status open_metrics(zr_trainer *t, int start)
{
    const zr_train_config *c = &t->cfg;
    if (c->metrics_path[0] == '\0') {
        return ZR_OK;
    }
    zr_status st = ZR_OK;
    if (t->rank == 0) {
        size_t dropped = 0;
        /* a resumed run continues the curve, cut back to the step it resumes from */
        int resumed = c->resume || c->resume_from[0] != '\0';
        st = zr_metrics_open(&t->metrics, c->metrics_path, resumed, start, &dropped);
        if (st == ZR_OK && dropped > 0) {
            note(t, ZR_LOG_INFO, "%s: dropped %zu line%s after step %d, the step resumed from",
                 c->metrics_path, dropped, dropped == 1 ? "" : "s", start);
        }
    }
    return zr_comm_agree(&t->comm, st);
}

/* ---- the public loop ------------------------------------------------------------- */

/* Lock the checkpoint dir, clear a crashed save's leftovers, refuse to mix two runs. */
static zr_status claim_checkpoint_dir(zr_trainer *t)
{
    const zr_train_config *c = &t->cfg;
    if (c->checkpoint_dir[0] == '\0') {
        return ZR_OK;
    }
    /* one run per checkpoint dir, for the whole run; then clear what a crashed save left,
       so that it never blocks this run */
    zr_status st = t->rank == 0 ? zr_ckpt_lock(c->checkpoint_dir, &t->lock) : ZR_OK;
    if (st == ZR_OK && t->rank == 0) {
        st = zr_ckpt_recover(c->checkpoint_dir, warn_ckpt, t);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    if (c->resume || c->resume_from[0] != '\0') {
        return ZR_OK;
    }
    /* a fresh run must not mix its checkpoints and metrics with another run's */
    char found_path[ZR_PATH_MAX];
    int found = 0;
    st = zr_ckpt_find_latest(c->checkpoint_dir, found_path, sizeof found_path, &found);
    if (st == ZR_OK && found) {
        st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                         "checkpoint dir %s already holds checkpoints (newest %s); pass "
                         "--resume to continue from it, or choose an empty zr.checkpoint.dir",
                         c->checkpoint_dir, found_path);
    }
    return zr_comm_agree(&t->comm, st);
}

zr_status zr_trainer_init(zr_trainer *t, MPI_Comm world, const zr_train_config *cfg,
                          zr_trainer_note_fn note_fn, void *note_ctx)
{
    memset(t, 0, sizeof *t);
    t->lock.fd = -1;
    t->cfg = *cfg;
    t->note = note_fn;
    t->note_ctx = note_ctx;
    MPI_Comm_rank(world, &t->rank);
    MPI_Comm_size(world, &t->world);
    zr_comm_config cc = {0, cfg->zero_hpz_partition_size};
    ZR_CHECK(zr_comm_init(&t->comm, world, &cc));
    t->comm_up = 1;
    /* every failure ends the run: the first one is announced to every rank at once */
    zr_comm_set_timeout(&t->comm, cfg->timeout_s);
    zr_comm_set_fail_fast(&t->comm, 1);
    zr_gpt_set_threads(cfg->threads);
    ZR_CHECK(zr_comm_agree(&t->comm, schedule_of(&t->cfg, &t->sched)));
    ZR_CHECK(setup(t));
    /* the manifest records the shape zr.model.init gave, not the defaults it replaced */
    zr_status st = zr_config_to_json(&t->cfg, &t->config_json);
    if (st == ZR_OK) {
        st = t->cfg.init_path[0] != '\0'
                 ? zr_gpt_engine_load_llmc(&t->engine, &t->model, t->cfg.init_path)
                 : zr_gpt_engine_init_params(&t->engine, &t->model, t->cfg.seed);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    ZR_CHECK(claim_checkpoint_dir(t));
    t->sum.val_loss = NAN;
    t->sum.first_loss = NAN;
    t->sum.last_loss = NAN;
    return ZR_OK;
}

zr_status zr_trainer_resume(zr_trainer *t)
{
    if (t->cfg.checkpoint_dir[0] == '\0' && t->cfg.resume_from[0] == '\0') {
        return zr_comm_agree(&t->comm,
                             zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                                         "--resume needs zr.checkpoint.dir (--ckpt-dir)"));
    }
    int start = 0;
    ZR_CHECK(resume_at(t, &start));
    t->start = t->next = start;
    return ZR_OK;
}

int zr_trainer_done(const zr_trainer *t)
{
    return t->next >= t->cfg.train_steps;
}

void zr_trainer_request_stop(zr_trainer *t)
{
    t->stop = 1;
}

zr_memory zr_trainer_memory(const zr_trainer *t)
{
    return zr_engine_memory(&t->engine);
}

zr_status zr_trainer_save(zr_trainer *t, char *path, size_t len)
{
    /* a checkpoint is never ahead of its metrics */
    ZR_CHECK(metrics_agree(t));
    return save(t, t->next, path, len);
}

/* The micro-batches of one step and the engine's step; *local = this rank's loss sum. */
static zr_status forward_backward_update(zr_trainer *t, float lr, double *local, zr_step_stats *st)
{
    *local = 0.0;
    for (int k = 0; k < t->cfg.gradient_accumulation_steps; k++) {
        float l;
        zr_loader_next(&t->train, t->inputs, t->targets);
        ZR_CHECK(zr_gpt_engine_micro(&t->model, &t->engine, t->inputs, t->targets, &l));
        *local += l;
    }
    return zr_engine_step(&t->engine, lr, st);
}

/* The step's numbers into its record and the run's totals (v: the control all-reduce). */
static void fill_record(zr_trainer *t, zr_step_record *rec, const zr_step_stats *st,
                        const double *v)
{
    const zr_train_config *c = &t->cfg;
    int done = rec->step, accum = c->gradient_accumulation_steps;
    rec->loss = (float)(v[0] / ((double)t->world * accum));
    rec->bytes_intra = v[1];
    rec->bytes_inter = v[2];
    rec->zero3_bytes_inter = v[3];
    rec->stop = v[4] > 0;
    rec->grad_norm = st->grad_norm;
    rec->skipped = st->skipped;
    rec->t_step = st->t_total;
    rec->t_comm = st->t_comm;
    rec->t_optim = st->t_optim;
    rec->t_compute = st->t_total - st->t_comm - st->t_optim;
    rec->tokens_per_s =
        (double)t->world * accum * c->train_micro_batch_size_per_gpu * c->seq_len / st->t_total;
    rec->eta_s = (zr_now() - t->t_run) / (done - t->start) * (c->train_steps - done);
    rec->print = done % c->steps_per_print == 0 || done == c->train_steps || done == t->start + 1;
    rec->val_loss = NAN;
    rec->validated = c->val_every > 0 && (done % c->val_every == 0 || done == c->train_steps);
    if (done == t->start + 1) {
        t->sum.first_loss = rec->loss;
    }
    t->sum.last_loss = rec->loss;
    t->sum.bytes_intra += v[1];
    t->sum.bytes_inter += v[2];
    t->sum.zero3_bytes_inter += v[3];
}

/* Stop a run whose loss or gradient stayed non-finite for max_nonfinite_steps steps. */
static zr_status check_divergence(zr_trainer *t, const zr_step_record *rec)
{
    const zr_train_config *c = &t->cfg;
    /* the loss and the norm are global, so every rank counts the same steps */
    t->nonfinite = isfinite(rec->loss) && !rec->skipped ? 0 : t->nonfinite + 1;
    if (c->max_nonfinite_steps > 0 && t->nonfinite >= c->max_nonfinite_steps) {
        ZR_FAIL(ZR_ERR_NONFINITE,
                "training diverged: the loss or the gradient norm was not finite for %d "
                "consecutive steps (steps %d to %d; last loss %g, gradient norm %g); nothing "
                "was saved from them. Lower optimizer.params.lr (now %g) or raise "
                "zr.train.max_nonfinite_steps (0 = never stop)",
                t->nonfinite, rec->step - t->nonfinite + 1, rec->step, (double)rec->loss,
                rec->grad_norm, c->lr);
    }
    return ZR_OK;
}

static zr_status step_body(zr_trainer *t, zr_step_record *rec)
{
    const zr_train_config *c = &t->cfg;
    if (!t->metrics_open) {
        ZR_CHECK(open_metrics(t, t->start));
        t->metrics_open = 1;
        t->t_run = zr_now();
    }
    int step = t->next, done = step + 1;
    zr_comm_set_step(&t->comm, done); /* as printed: steps count from 1 */
    rec->step = done;
    rec->total = c->train_steps;
    rec->lr = (float)zr_lr_at(&t->sched, step);
    double local;
    zr_step_stats st;
    ZR_CHECK(forward_backward_update(t, rec->lr, &local, &st));
    t->next = done;

    /* one control all-reduce: loss, bytes, the ZeRO-3 shadow, a stop request and a failed
       metrics write of rank 0 (reported one step late rather than with a collective per step) */
    double v[6] = {local,
                   (double)sum_bytes(&st.traffic, 0),
                   (double)sum_bytes(&st.traffic, 1),
                   (double)st.zero3_bytes_inter,
                   (double)(t->stop != 0),
                   (double)(t->metrics_st != ZR_OK)};
    ZR_CHECK(zr_comm_allreduce_sum_f64(&t->comm, ZR_GROUP_WORLD, v, 6));
    if (v[5] > 0) {
        return metrics_agree(t);
    }
    fill_record(t, rec, &st, v);
    if (rec->validated) {
        ZR_CHECK(validate(t, &rec->val_loss));
        t->sum.val_loss = rec->val_loss;
    }
    if (t->rank == 0) {
        write_metrics(t, done, rec->loss, rec->lr, &st, rec->tokens_per_s, rec->t_compute, v,
                      rec->validated, rec->val_loss);
    }
    ZR_CHECK(check_divergence(t, rec));
    int ckpt_due = c->checkpoint_dir[0] != '\0' && c->checkpoint_every > 0 &&
                   done % c->checkpoint_every == 0 && done != c->train_steps;
    if (ckpt_due || rec->stop) {
        /* a checkpoint, or the end of a stopped run, is never ahead of its metrics */
        ZR_CHECK(metrics_agree(t));
        if (c->checkpoint_dir[0] != '\0') {
            ZR_CHECK(save(t, done, rec->checkpoint, sizeof rec->checkpoint));
        }
    }
    return ZR_OK;
}

zr_status zr_trainer_step(zr_trainer *t, zr_step_record *rec)
{
    memset(rec, 0, sizeof *rec);
    ZR_ASSERT(!zr_trainer_done(t));
    zr_status st = step_body(t, rec);
    if (st != ZR_OK && st != ZR_ERR_REMOTE) {
        /* mid-step: the others may be waiting for this rank's next exchange */
        zr_comm_notify(&t->comm, st);
    }
    return st;
}

zr_status zr_trainer_finish(zr_trainer *t, zr_train_summary *sum)
{
    ZR_CHECK(metrics_agree(t));
    t->sum.start = t->start;
    t->sum.end = t->next;
    t->sum.seconds = t->t_run > 0 ? zr_now() - t->t_run : 0.0;
    t->sum.checkpoint[0] = '\0';
    if (t->cfg.checkpoint_dir[0] != '\0' && t->start < t->next) {
        ZR_CHECK(save(t, t->next, t->sum.checkpoint, sizeof t->sum.checkpoint));
    }
    *sum = t->sum;
    return ZR_OK;
}

zr_status zr_trainer_conclude(zr_trainer *t, zr_status st)
{
    /* every path ends agreed: a rank may have stopped waiting because another failed
       (ZR_ERR_REMOTE), and only the agreement names the failure that caused it */
    return t->comm_up ? zr_comm_agree(&t->comm, st) : st;
}

void zr_trainer_free(zr_trainer *t, int exit_code)
{
    if (exit_code != 0 && t->comm_up && zr_comm_broken(&t->comm)) {
        /* exchanges abandoned mid-step still own their buffers: no orderly shutdown */
        zr_comm_abort(&t->comm, exit_code);
    }
    if (t->engine_up) {
        zr_engine_free(&t->engine);
    }
    zr_gpt_specs_free(&t->specs);
    zr_gpt_free(&t->model);
    zr_dataset_free(&t->data);
    zr_free(t->inputs);
    zr_free(t->targets);
    zr_free(t->config_json);
    zr_ckpt_unlock(&t->lock);
    zr_metrics_close(&t->metrics);
    if (t->comm_up) {
        zr_comm_free(&t->comm);
    }
    memset(t, 0, sizeof *t);
    t->lock.fd = -1;
}
