/*
 * trainer.c - the training loop: how one step of zr happens, top to bottom.
 *
 *   init     configuration -> communicator (hpZ group), then the set-up of
 *            trainer_setup.c (data, model shape, loaders, sizes checked
 *            against this node's memory, model, engine), parameters
 *            (zr.model.init or the seed), checkpoint dir locked and cleared
 *            of a crashed save's leftovers
 *   resume   (trainer_resume.c) the newest intact checkpoint (or
 *            --resume-from): engine state resharded to this world size,
 *            loader placed by the token count
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

#include "trainer_impl.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

/* ---- init ---------------------------------------------------------------------- */

zr_status zr_trainer_init(zr_trainer *t, MPI_Comm world, const zr_train_config *cfg,
                          zr_trainer_note_fn note_fn, void *note_ctx)
{
    memset(t, 0, sizeof *t);
    t->lock.fd = -1;
    t->resumed_from = -1;
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
    ZR_CHECK(zr_trainer_setup(t));
    /* the manifest records the shape zr.model.init gave, not the defaults it replaced */
    ZR_CHECK(zr_comm_agree(&t->comm, zr_config_to_json(&t->cfg, &t->config_json)));
    /* the readers refuse a weight that is not finite; a folder's is collective (each rank reads
       its shards) and agreed inside */
    zr_status st = t->cfg.init_path[0] == '\0'
                       ? zr_gpt_engine_init_params(&t->engine, &t->mcfg, t->cfg.seed)
                   : zr_trainer_init_is_hf(t)
                       ? zr_gpt_engine_load_hf(&t->engine, &t->mcfg, t->cfg.init_path)
                       : zr_gpt_engine_load_llmc(&t->engine, &t->mcfg, t->cfg.init_path);
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    ZR_CHECK(zr_trainer_claim_dir(t));
    zr_trainer_check_grace(t);
    t->sum.val_loss = NAN;
    t->sum.first_loss = NAN;
    t->sum.last_loss = NAN;
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

/* The run a SIGINT or SIGTERM asks to stop (zr_trainer_catch_signals); NULL after its free. */
static zr_trainer *signal_target;

static void on_signal(int sig)
{
    (void)sig;
    if (signal_target != NULL) {
        zr_trainer_request_stop(signal_target);
    }
}

void zr_trainer_catch_signals(zr_trainer *t)
{
    signal_target = t;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- one step --------------------------------------------------------------------- */

static zr_status validate(zr_trainer *t, float *loss)
{
    zr_loader_seek(&t->val, 0);
    double sum = 0.0;
    for (int i = 0; i < t->cfg.val_batches; i++) {
        float l;
        zr_loader_next(&t->val, t->inputs, t->targets);
        ZR_CHECK(zr_gpt_engine_eval(&t->run, &t->engine, t->inputs, t->targets, &l));
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
    if (zr_mem_device_peak() > 0) { /* this run's (zr_trainer_init_model reset it) */
        zr_metrics_line_i64(&l, "device_mem_peak", (long long)zr_mem_device_peak());
    }
    if (do_val) {
        zr_metrics_line_f32(&l, "val_loss", val_loss);
    }
    t->metrics_st = zr_metrics_append(&t->metrics, zr_metrics_line_end(&l));
    if (t->metrics_st != ZR_OK) {
        snprintf(t->metrics_err, sizeof t->metrics_err, "%s", zr_error_message());
    }
}

/* The micro-batches of one step and the engine's step; *local = this rank's loss sum. */
static zr_status forward_backward_update(zr_trainer *t, float lr, double *local, zr_step_stats *st)
{
    *local = 0.0;
    for (int k = 0; k < t->cfg.gradient_accumulation_steps; k++) {
        float l;
        zr_loader_next(&t->train, t->inputs, t->targets);
        ZR_CHECK(zr_gpt_engine_micro(&t->run, &t->engine, t->inputs, t->targets, &l));
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
    rec->device_mem_peak = (double)zr_mem_device_peak(); /* 0 where nothing is in device memory */
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

/*
 * A warning for each skipped step (named by its training step), and the end
 * of a run whose loss or gradient stayed non-finite for max_nonfinite_steps
 * steps. The state the run started from was checked finite as it was read
 * (a checkpoint or zr.model.init; a NaN there is refused at load), so these
 * steps produced the non-finite values, and the message says so.
 */
static zr_status check_divergence(zr_trainer *t, const zr_step_record *rec)
{
    const zr_train_config *c = &t->cfg;
    if (rec->skipped) {
        zr_trainer_note(t, ZR_LOG_WARN,
                        "step %d: non-finite gradient norm (%g): the optimizer step is skipped on "
                        "every rank",
                        rec->step, rec->grad_norm);
    }
    /* the loss and the norm are global, so every rank counts the same steps */
    t->nonfinite = isfinite(rec->loss) && !rec->skipped ? 0 : t->nonfinite + 1;
    if (c->max_nonfinite_steps > 0 && t->nonfinite >= c->max_nonfinite_steps) {
        char from[96];
        if (t->resumed_from >= 0) {
            snprintf(from, sizeof from, "the checkpoint of step %lld", (long long)t->resumed_from);
        } else {
            snprintf(from, sizeof from, "%s",
                     c->init_path[0] != '\0' ? "zr.model.init's weights" : "the seed's weights");
        }
        ZR_FAIL(ZR_ERR_NONFINITE,
                "training diverged: the loss or the gradient norm was not finite for %d "
                "consecutive steps (steps %d to %d; last loss %g, gradient norm %g); nothing "
                "was saved from them. The state they started from (%s) was checked finite "
                "when loaded: training produced the non-finite values. Lower "
                "optimizer.params.lr (now %g) or raise zr.train.max_nonfinite_steps (0 = never "
                "stop)",
                t->nonfinite, rec->step - t->nonfinite + 1, rec->step, (double)rec->loss,
                rec->grad_norm, from, c->lr);
    }
    return ZR_OK;
}

/*
 * The checkpoint dir and the metrics file are still the ones this run locked (rank 0 holds the
 * locks; agreed): one deleted or replaced under the run stops it with the reason, rather than a
 * save re-creating the folder without its lock or lines going where no one reads them.
 */
static zr_status outputs_held(zr_trainer *t)
{
    zr_status st = ZR_OK;
    if (t->rank == 0 && t->cfg.checkpoint_dir[0] != '\0') {
        st = zr_ckpt_lock_check(t->cfg.checkpoint_dir, &t->lock);
    }
    if (st == ZR_OK && t->rank == 0) {
        st = zr_metrics_check_held(&t->metrics);
    }
    return zr_comm_agree(&t->comm, st);
}

/*
 * A checkpoint of the state after step (what zr_ckpt_meta records beside the
 * engine's state, and the resumes that led to it); rotation never deletes
 * the checkpoint this run resumed from. *seconds = how long it took.
 */
static zr_status save(zr_trainer *t, int step, char *path, size_t len, double *seconds)
{
    zr_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.step = step;
    meta.optim_steps = t->engine.step;
    /* windows consumed x T: where the data stands at any world size and batch */
    meta.tokens = zr_loader_windows(&t->train) * (uint64_t)t->cfg.seq_len;
    meta.seed = t->cfg.seed; /* a resume refuses another seed: it is the checkpoint's */
    meta.stage = t->cfg.stage;
    meta.model = t->mcfg;
    snprintf(meta.data, sizeof meta.data, "%s", t->data_id);
    zr_ckpt_save_opts o = {t->config_json, t->history_json, t->cfg.keep_checkpoints,
                           t->resumed_from};
    double t0 = zr_now();
    ZR_CHECK(outputs_held(t));
    zr_status st = zr_ckpt_save(&t->comm, &t->engine, t->cfg.checkpoint_dir, &meta, &o, path, len);
    *seconds = zr_now() - t0;
    return st;
}

static zr_status step_body(zr_trainer *t, zr_step_record *rec)
{
    const zr_train_config *c = &t->cfg;
    if (!t->metrics_open) {
        ZR_CHECK(zr_trainer_open_metrics(t, t->start));
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
            double took;
            ZR_CHECK(save(t, done, rec->checkpoint, sizeof rec->checkpoint, &took));
            zr_trainer_warn_grace(t, rec->t_step, took);
            /* a stop asked for during the save: this checkpoint is the stop's, so the
               launcher's grace period need not hold one more step and one more save */
            double stop = t->stop != 0;
            ZR_CHECK(zr_comm_allreduce_sum_f64(&t->comm, ZR_GROUP_WORLD, &stop, 1));
            rec->stop |= stop > 0;
        }
    }
    return ZR_OK;
}

zr_status zr_trainer_step(zr_trainer *t, zr_step_record *rec)
{
    memset(rec, 0, sizeof *rec);
    ZR_ASSERT(!zr_trainer_done(t));
    zr_status st = step_body(t, rec);
    if (st != ZR_OK && st != ZR_ERR_REMOTE && !zr_error_agreed()) {
        /* mid-step: the others may be waiting for this rank's next exchange (an error agreed
           on is every rank's already: nobody waits) */
        zr_comm_notify(&t->comm, st);
    }
    return st;
}

/* ---- finish -------------------------------------------------------------------- */

zr_status zr_trainer_finish(zr_trainer *t, zr_train_summary *sum)
{
    ZR_CHECK(metrics_agree(t));
    t->sum.start = t->start;
    t->sum.end = t->next;
    t->sum.seconds = t->t_run > 0 ? zr_now() - t->t_run : 0.0;
    t->sum.checkpoint[0] = '\0';
    /* zr.train.train_steps 0 on a fresh run: the initial weights are its checkpoint */
    int initial = t->next == 0 && t->cfg.train_steps == 0 && t->resumed_from < 0;
    if (t->cfg.checkpoint_dir[0] != '\0' && (t->start < t->next || initial)) {
        double took;
        ZR_CHECK(save(t, t->next, t->sum.checkpoint, sizeof t->sum.checkpoint, &took));
    } else {
        ZR_CHECK(outputs_held(t));
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
    if (signal_target == t) {
        signal_target = NULL;
    }
    if (exit_code != 0 && t->comm_up && zr_comm_broken(&t->comm)) {
        /* exchanges abandoned mid-step still own their buffers: no orderly shutdown */
        zr_comm_abort(&t->comm, exit_code);
    }
    if (t->engine_up) {
        zr_engine_free(&t->engine);
    }
    zr_gpt_specs_free(&t->specs);
    zr_dataset_free(&t->data);
    zr_dataset_free(&t->val_data);
    zr_free(t->inputs);
    zr_free(t->targets);
    zr_free(t->config_json);
    zr_free(t->history_json);
    zr_free(t->resume_event);
    zr_ckpt_unlock(&t->lock);
    zr_metrics_close(&t->metrics);
    if (t->comm_up) {
        zr_comm_free(&t->comm);
    }
    /* after the communicator: a device transport follows the model's stream */
    zr_gpt_run_free(&t->run);
    memset(t, 0, sizeof *t);
    t->lock.fd = -1;
    t->resumed_from = -1;
}
