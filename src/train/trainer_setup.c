/*
 * trainer_setup.c - what zr_trainer_init prepares before the first step
 * (trainer_impl.h): the schedule, the data, the model's shape (from the
 * configuration or a zr.model.init file), the loaders, sizes and memory
 * checked against this node before anything large is allocated, the model
 * and the engine; the checkpoint dir claimed; and, at the first step, the
 * metrics file.
 *
 * Each check runs on every rank and is agreed on, so a file that one node
 * cannot read or a node with less memory ends every rank with the same
 * message, naming the keys to change.
 */
#define _POSIX_C_SOURCE 200809L

#include "trainer_impl.h"

#include "zr/launch.h"
#include "zr/pool.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

extern char **environ; /* POSIX; unistd.h declares it only for _GNU_SOURCE */

void zr_trainer_note(const zr_trainer *t, zr_log_level level, const char *fmt, ...)
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

void zr_trainer_warn_ckpt(void *ctx, const char *msg)
{
    zr_trainer_note((const zr_trainer *)ctx, ZR_LOG_WARN, "%s", msg);
}

/* ---- the schedule, data, model and engine ---------------------------------------- */

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

static zr_status load_data(zr_trainer *t)
{
    const zr_train_config *c = &t->cfg;
    if (c->data_path[0] == '\0') {
        ZR_CHECK(zr_dataset_load_fortunes(&t->data, ZR_FORTUNES_DIR));
        return zr_dataset_set_vocab(&t->data, "the bundled corpus", c->vocab_size);
    }
    /* what the file is (llm.c shard of either kind, or text) comes from its content */
    ZR_CHECK(zr_dataset_load(&t->data, c->data_path, c->vocab_size));
    if (c->val_path[0] == '\0' || c->val_every <= 0) {
        return ZR_OK; /* the validation split of zr.data.path, or none read */
    }
    ZR_CHECK(zr_dataset_load(&t->val_data, c->val_path, t->data.vocab));
    if (t->val_data.kind != t->data.kind) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s (zr.data.val_path) is %s, %s (zr.data.path) %s: both must be "
                "tokenised alike",
                c->val_path, zr_data_kind_name(t->val_data.kind), c->data_path,
                zr_data_kind_name(t->data.kind));
    }
    return ZR_OK;
}

/*
 * The model's vocabulary decides, not the shard kind's: every token of the
 * training and validation data must be below the vocabulary of the model
 * file at path (a uint16 shard serves any vocabulary up to 65536, a uint32
 * shard any); the first one that is not is named with its file and index.
 */
static zr_status check_model_vocab(const zr_trainer *t, int vocab, const char *path)
{
    const zr_train_config *c = &t->cfg;
    const char *file = NULL;
    size_t at = 0;
    uint32_t tok = 0;
    for (int v = 0; v < 2 && t->data.vocab != vocab; v++) {
        const zr_dataset *d = v == 0 ? &t->data : &t->val_data;
        const char *p = v == 0 ? c->data_path : c->val_path;
        if (zr_dataset_find_beyond(d, p, (uint32_t)vocab, &file, &at, &tok)) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "%s (%s) is %s with a vocabulary of %d tokens, but the model file %s "
                    "(zr.model.init) has %d: token %u at position %zu of %s is not in it; train "
                    "it on data tokenised for it (an llm.c GPT-2 token shard for GPT-2 weights)",
                    p[0] ? p : "the bundled corpus", v == 0 ? "zr.data.path" : "zr.data.val_path",
                    zr_data_kind_name(d->kind), t->data.vocab, path, vocab, tok, at,
                    file[0] ? file : "the bundled corpus");
        }
    }
    return ZR_OK;
}

int zr_trainer_init_is_hf(const zr_trainer *t)
{
    struct stat sb;
    return t->cfg.init_path[0] != '\0' && stat(t->cfg.init_path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/*
 * The model's shape: from the configuration, or from the llm.c model file or
 * Hugging Face folder of zr.model.init, whose shape the keys given must match and whose vocabulary
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
    ZR_CHECK(zr_trainer_init_is_hf(t) ? zr_gpt_config_read_hf(c->init_path, &fc)
                                      : zr_gpt_read_llmc_config(c->init_path, &fc));
    if (!(c->given & ZR_GIVEN_SEQ_LEN) && c->seq_len > fc.max_t) {
        zr_trainer_note(t, ZR_LOG_INFO,
                        "zr.model.seq_len is %d, not the default %d: the model file %s has %d "
                        "positions (a value given explicitly is kept, and refused)",
                        fc.max_t, c->seq_len, c->init_path, fc.max_t);
        c->seq_len = fc.max_t;
    }
    ZR_CHECK(zr_config_adopt_model(c, &fc, c->init_path));
    ZR_CHECK(check_model_vocab(t, fc.vocab, c->init_path));
    t->mcfg = fc;
    return ZR_OK;
}

zr_status zr_trainer_check_accum(const zr_trainer *t)
{
    const zr_train_config *c = &t->cfg;
    size_t train_batches = zr_loader_batches_per_epoch(&t->train);
    double global = (double)t->world * c->train_micro_batch_size_per_gpu * c->seq_len;
    if ((size_t)c->gradient_accumulation_steps > train_batches) {
        ZR_FAIL(ZR_ERR_INVALID,
                "one optimizer step (gradient_accumulation_steps %d x %.0f tokens) reads more than "
                "the whole training split (%zu batches of %.0f tokens): lower "
                "gradient_accumulation_steps or train_batch_size to at most %zu batches",
                c->gradient_accumulation_steps, global, train_batches, global, train_batches);
    }
    return ZR_OK;
}

/*
 * The sizes whose defaults depend on the input fit it, each with a one-line
 * note: the micro-batch first, then the sequence length, so that one global
 * batch (and one more token) fits each split the run reads. A value given
 * explicitly is kept, for the loader to refuse naming the keys.
 */
static void fit_batch(zr_trainer *t)
{
    zr_train_config *c = &t->cfg;
    size_t val = t->data.n * ZR_VAL_PERCENT / 100, have = t->data.n - val, W = (size_t)t->world;
    if (t->val_data.nshards > 0) { /* a validation file: the training data is all of data */
        val = t->val_data.n;
        have = t->data.n;
    }
    int on_val = c->val_every > 0 && val < have;
    have = on_val ? val : have;
    int B = c->train_micro_batch_size_per_gpu, T = c->seq_len;
    if (have <= W || W * B * T + 1 <= have) {
        return;
    }
    size_t room = (have - 1) / W; /* tokens of one rank's share of a global batch */
    const char *name = c->data_path[0] ? c->data_path : "the bundled corpus";
    char why[600];
    snprintf(why, sizeof why,
             "the %s split of %s holds %zu tokens, and one global batch (%zu rank%s x "
             "micro-batch x zr.model.seq_len) must fit it with one more; a value given explicitly "
             "is kept, and refused",
             on_val ? "validation" : "training", name, have, W, W == 1 ? "" : "s");
    if (!(c->given & (ZR_GIVEN_MICRO_BATCH | ZR_GIVEN_TRAIN_BATCH)) && B > 1) {
        int nb = room / (size_t)T >= 1 ? (int)(room / (size_t)T) : 1;
        zr_trainer_note(t, ZR_LOG_INFO, "train_micro_batch_size_per_gpu is %d, not %d: %s", nb, B,
                        why);
        B = c->train_micro_batch_size_per_gpu = nb;
        c->train_batch_size = (int)((size_t)nb * (size_t)c->gradient_accumulation_steps * W);
    }
    if (!(c->given & ZR_GIVEN_SEQ_LEN) && (size_t)B * T > room && room / (size_t)B >= 1) {
        int nt = (int)(room / (size_t)B);
        zr_trainer_note(t, ZR_LOG_INFO, "zr.model.seq_len is %d, not %d: %s", nt, T, why);
        c->seq_len = nt;
    }
}

/* zr.data.val_batches by default takes at most what the validation split holds. */
static void fit_val_batches(zr_trainer *t)
{
    zr_train_config *c = &t->cfg;
    size_t have = zr_loader_batches_per_epoch(&t->val);
    if (c->val_every <= 0 || (c->given & ZR_GIVEN_VAL_BATCHES) || (size_t)c->val_batches <= have) {
        return;
    }
    zr_trainer_note(t, ZR_LOG_INFO,
                    "zr.data.val_batches is %zu, not %d: the validation split of %s holds %zu "
                    "batch%s of %d rank%s x %d x %d tokens (a value given explicitly is kept, "
                    "and refused)",
                    have, c->val_batches, c->data_path[0] ? c->data_path : "the bundled corpus",
                    have, have == 1 ? "" : "es", t->world, t->world == 1 ? "" : "s",
                    c->train_micro_batch_size_per_gpu, c->seq_len);
    c->val_batches = (int)have;
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
    size_t val_batches = zr_loader_batches_per_epoch(&t->val);
    double global = (double)t->world * c->train_micro_batch_size_per_gpu * c->seq_len;
    if (c->val_every > 0 && (size_t)c->val_batches > val_batches) {
        ZR_FAIL(
            ZR_ERR_INVALID,
            "zr.data.val_batches (%d) is more than the %zu batches of %.0f tokens (%d rank%s x "
            "train_micro_batch_size_per_gpu %d x zr.model.seq_len %d) that the validation split "
            "holds; each pass would read the same tokens again: use at most %zu (or "
            "zr.data.val_every 0 for no validation)",
            c->val_batches, val_batches, global, t->world, t->world == 1 ? "" : "s",
            c->train_micro_batch_size_per_gpu, c->seq_len, val_batches);
    }
    ZR_CHECK(zr_trainer_check_accum(t));
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
    ZR_CHECK(zr_gpt_engine_predict_on(t->be, &t->mcfg, &t->shape, &t->ecfg, &t->comm, &t->mem_host,
                                      &t->mem_dev));
    if (t->mem_dev.total > 0) {
        /* in device memory: zr_trainer_init_model checks them there */
        acts = 0;
        state = 0;
    }
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
    /* what lives in host memory: everything where the model computes there (its activations
       by its own count: the CPU's with its bf16 products' scratch); only the program, MPI and the
       transport's staging where the model and the engine's state live on a device, whose memory
       zr_trainer_init_model checks (check_sizes predicted both) */
    const zr_gpt_memory_prediction p = t->mem_host;
    const double GB = 1e9;
    if (p.total > p.allowance) {
        zr_trainer_note(t, ZR_LOG_INFO,
                        "memory: predicted peak per rank %.2f GB = model state %.2f + activations "
                        "%.2f + engine buffers %.2f (bounded by the live-parameter, prefetch and "
                        "reduce buckets) + allowance %.2f",
                        p.total / GB, p.state / GB, p.activations / GB, p.pool / GB,
                        p.allowance / GB);
    }
    struct rlimit rl;
    double mapped_pages = 0;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        proc_number("/proc/self/statm", "", &mapped_pages)) {
        double mapped = mapped_pages * (double)sysconf(_SC_PAGESIZE);
        /* what zr will map: everything but the allowance, which is mapped already */
        double need = mapped + (double)(p.total - p.allowance);
        zr_trainer_note(t, ZR_LOG_INFO,
                        "memory: needs %.2f GB of address space per rank, limit %.2f GB "
                        "(RLIMIT_AS; %.2f GB mapped before the model)",
                        need / GB, (double)rl.rlim_cur / GB, mapped / GB);
        if (need > (double)rl.rlim_cur) {
            ZR_FAIL(ZR_ERR_NOMEM,
                    "needs %.2f GB, limit %.2f GB (RLIMIT_AS; %.2f GB mapped before the "
                    "model, predicted %.2f GB of model state for zero_optimization.stage %d over "
                    "%d rank%s, %.2f GB of activations, %.2f GB of engine buffers): use more "
                    "ranks, a higher stage, activation checkpointing, or smaller reduce/prefetch "
                    "buckets",
                    need / GB, (double)rl.rlim_cur / GB, mapped / GB, p.state / GB, c->stage,
                    t->world, t->world == 1 ? "" : "s", p.activations / GB, p.pool / GB);
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
                    "zero_optimization.stage %d over %d rank%s, %.2f GB of activations, %.2f GB of "
                    "engine buffers): use more nodes, a higher stage, or activation checkpointing",
                    (double)p.total / GB, share / GB, avail_kb * 1024.0 / GB, per_node,
                    per_node == 1 ? "" : "s", p.state / GB, c->stage, t->world,
                    t->world == 1 ? "" : "s", p.activations / GB, p.pool / GB);
        }
    }
    return ZR_OK;
}

zr_status zr_trainer_setup(zr_trainer *t)
{
    zr_train_config *c = &t->cfg;
    ZR_CHECK(zr_comm_agree(&t->comm, schedule_of(c, &t->sched)));
    ZR_CHECK(zr_comm_agree(&t->comm, load_data(t)));
    ZR_CHECK(zr_launch_check_data(&t->comm, &t->data, t->cfg.data_path));
    if (t->val_data.nshards > 0) {
        ZR_CHECK(zr_launch_check_data(&t->comm, &t->val_data, t->cfg.val_path));
    }
    zr_launch_data_id(&t->data, t->data_id, sizeof t->data_id);
    ZR_CHECK(zr_comm_agree(&t->comm, model_shape(t)));
    fit_batch(t);
    int B = c->train_micro_batch_size_per_gpu, T = c->seq_len;
    int vfile = t->val_data.nshards > 0;
    zr_status st = zr_loader_init(&t->train, &t->data, vfile ? ZR_SPLIT_ALL : ZR_SPLIT_TRAIN, B, T,
                                  t->rank, t->world);
    zr_loader_shuffle(&t->train, c->shuffle, c->seed);
    if (st == ZR_OK && c->val_every > 0) {
        /* without validation the split is not read: it need not hold a batch */
        st = zr_loader_init(&t->val, vfile ? &t->val_data : &t->data,
                            vfile ? ZR_SPLIT_ALL : ZR_SPLIT_VAL, B, T, t->rank, t->world);
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
    fit_val_batches(t);
    ZR_CHECK(zr_trainer_pick_device(t));
    t->ecfg = zr_config_engine(c, t->be->bf16_work_type);
    /* bf16.enabled, as in DeepSpeed: bf16 weights and activations on a GPU (fp32 accumulation,
       fp32 master weights in the engine), the matrix products' inputs on the CPU; false gives
       the fp32 mode compared across devices and with llm.c */
    t->shape = (zr_gpt_shape){B, T, c->activation_checkpointing && t->be->recompute,
                              c->bf16_enabled ? ZR_DTYPE_BF16 : ZR_DTYPE_F32};
    if (c->activation_checkpointing && !t->be->recompute) {
        zr_trainer_note(t, ZR_LOG_WARN,
                        "zr.model.activation_checkpointing has no effect on the %s backend yet: "
                        "every activation is kept",
                        t->be->name);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, check_sizes(t)));
    ZR_CHECK(zr_comm_agree(&t->comm, check_memory(t)));
    ZR_CHECK(zr_trainer_init_model(t, B, T));
    st = zr_gpt_specs_init(&t->specs, &t->mcfg);
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(t->inputs, (size_t)B * T);
    }
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(t->targets, (size_t)B * T);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    ZR_CHECK(zr_engine_init(&t->engine, &t->comm, &t->ecfg, t->specs.nunits, t->specs.units));
    t->engine_up = 1;
    return ZR_OK;
}

/* ---- the checkpoint dir and the metrics file ------------------------------------- */

/* The files this run reads: its metrics file may be none of them (zr/file.h's rule). */
static zr_status add_inputs(const zr_train_config *c, zr_file_inputs *in)
{
    ZR_CHECK(zr_file_inputs_add(in, c->data_path, "the training data (zr.data.path)"));
    ZR_CHECK(zr_file_inputs_add(in, c->val_path, "the validation data (zr.data.val_path)"));
    ZR_CHECK(zr_file_inputs_add(in, c->init_path, "the model file (zr.model.init)"));
    ZR_CHECK(zr_file_inputs_add(in, c->config_path, "the configuration file (--config)"));
    ZR_CHECK(zr_file_inputs_add(in, c->resume_from,
                                "the checkpoint resumed from (zr.checkpoint.resume_from)"));
    if (c->checkpoint_dir[0] == '\0') {
        return ZR_OK;
    }
    char p[ZR_PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", c->checkpoint_dir, ZR_CKPT_LOCK_FILE) < (int)sizeof p) {
        ZR_CHECK(zr_file_inputs_add(in, p, "the lock file of zr.checkpoint.dir"));
    }
    /* every checkpoint (and leftover) in the dir: a run may resume from any */
    DIR *d = opendir(c->checkpoint_dir);
    struct dirent *ent;
    zr_status st = ZR_OK;
    while (d != NULL && (ent = readdir(d)) != NULL) {
        if (strncmp(ent->d_name, "step_", 5) == 0 &&
            snprintf(p, sizeof p, "%s/%s", c->checkpoint_dir, ent->d_name) < (int)sizeof p) {
            ZR_CHECK_GOTO(zr_file_inputs_add(in, p, "a checkpoint in zr.checkpoint.dir"), st, done);
        }
    }
done:
    if (d != NULL) {
        closedir(d);
    }
    return st;
}

/*
 * The names zr gives its own files in the checkpoint dir (step_*, the lock)
 * are not free for the metrics file, even before they exist: a save would
 * then collide with it.
 */
static zr_status check_reserved(const char *dir, const char *metrics)
{
    struct stat ds, ps;
    if (dir[0] == '\0' || stat(dir, &ds) != 0) {
        return ZR_OK;
    }
    char p[ZR_PATH_MAX], child[ZR_PATH_MAX], shown[160];
    snprintf(p, sizeof p, "%s", metrics);
    for (int depth = 0; depth < 256; depth++) {
        char *slash = strrchr(p, '/');
        snprintf(child, sizeof child, "%s", slash != NULL ? slash + 1 : p);
        if (slash == NULL) {
            snprintf(p, sizeof p, ".");
        } else if (slash == p) {
            p[1] = '\0';
        } else {
            *slash = '\0';
        }
        if (stat(p, &ps) == 0 && ps.st_dev == ds.st_dev && ps.st_ino == ds.st_ino) {
            if (strncmp(child, "step_", 5) == 0 || strcmp(child, ZR_CKPT_LOCK_FILE) == 0) {
                ZR_FAIL(ZR_ERR_INVALID,
                        "zr.train.metrics_path %s uses the name %s in zr.checkpoint.dir, which "
                        "is zr's for its checkpoints and lock; choose another name",
                        zr_file_show(metrics, shown, sizeof shown), child);
            }
            return ZR_OK;
        }
        if (strcmp(p, ".") == 0 || strcmp(p, "/") == 0) {
            return ZR_OK;
        }
    }
    return ZR_OK;
}

/* Rank 0: the metrics file obeys the output rule, and is locked for this run (zr_metrics_lock:
   a fresh run's must be new or empty) until it ends, before the first step writes it. */
static zr_status check_outputs(zr_trainer *t)
{
    const zr_train_config *c = &t->cfg;
    if (c->metrics_path[0] == '\0') {
        return ZR_OK;
    }
    zr_file_inputs in;
    zr_file_inputs_init(&in);
    int exists = 0;
    zr_status st = ZR_OK;
    ZR_CHECK_GOTO(add_inputs(c, &in), st, done);
    ZR_CHECK_GOTO(
        zr_file_output_check(c->metrics_path, "zr.train.metrics_path (--metrics)", &in, &exists),
        st, done);
    ZR_CHECK_GOTO(check_reserved(c->checkpoint_dir, c->metrics_path), st, done);
    st = zr_metrics_lock(&t->metrics, c->metrics_path, !c->resume && c->resume_from[0] == '\0');
done:
    zr_file_inputs_free(&in);
    return st;
}

zr_status zr_trainer_claim_dir(zr_trainer *t)
{
    const zr_train_config *c = &t->cfg;
    if (c->checkpoint_dir[0] == '\0') {
        return zr_comm_agree(&t->comm, t->rank == 0 ? check_outputs(t) : ZR_OK);
    }
    /* one run per checkpoint dir, for the whole run; then clear what a crashed save left,
       so that it never blocks this run */
    zr_status st = t->rank == 0 ? zr_ckpt_lock(c->checkpoint_dir, &t->lock) : ZR_OK;
    if (st == ZR_OK && t->rank == 0) {
        st = zr_ckpt_recover(c->checkpoint_dir, zr_trainer_warn_ckpt, t);
    }
    if (st == ZR_OK && t->rank == 0 && !c->resume && c->resume_from[0] == '\0') {
        /* a fresh run must not mix its checkpoints and metrics with another run's */
        char found_path[ZR_PATH_MAX], shown[160];
        int found = 0;
        st = zr_ckpt_find_latest(c->checkpoint_dir, found_path, sizeof found_path, &found,
                                 zr_trainer_warn_ckpt, t);
        if (st == ZR_OK && found) {
            st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                             "checkpoint dir %s already holds checkpoints (newest %s); pass "
                             "--resume to continue from it, or choose an empty zr.checkpoint.dir",
                             zr_file_show(c->checkpoint_dir, shown, sizeof shown), found_path);
        }
        if (st == ZR_OK) {
            st = zr_ckpt_check_ahead(c->checkpoint_dir, 0);
        }
    }
    if (st == ZR_OK && t->rank == 0) {
        st = check_outputs(t);
    }
    return zr_comm_agree(&t->comm, st);
}

/* ---- a stop under a launcher ------------------------------------------------------ */

/* An assumed node's write rate for checkpoints: a guess, refined by the first save. */
#define ASSUMED_WRITE_BPS 200e6

void zr_trainer_check_grace(zr_trainer *t)
{
    char how[128];
    t->grace_s = zr_launch_grace_s(environ, how, sizeof how);
    if (t->cfg.checkpoint_dir[0] == '\0' || t->grace_s < 0) {
        return;
    }
    int per_node = t->comm.ranks_per_node > 0 ? t->comm.ranks_per_node : 1;
    double bytes = 12.0 * (double)zr_gpt_config_param_count(&t->mcfg) / t->world * per_node;
    double expect = bytes / ASSUMED_WRITE_BPS;
    if (expect > t->grace_s) {
        t->grace_warned = 1;
        zr_trainer_note(t, ZR_LOG_WARN,
                        "a stop (Ctrl-C or SIGTERM to mpirun) gives the ranks %.0f s (%s) "
                        "before SIGKILL, but a checkpoint of %.0f MB per node takes about %.0f s "
                        "to write (at %.0f MB/s) after the step in progress; the stop would lose "
                        "everything since the last checkpoint: launch with --mca "
                        "odls_base_sigkill_timeout %.0f or more (scripts/mpienv.sh sets 30)",
                        t->grace_s, how, bytes / 1e6, expect, ASSUMED_WRITE_BPS / 1e6,
                        4 * expect + 30);
    }
}

void zr_trainer_warn_grace(zr_trainer *t, double step_s, double save_s)
{
    if (t->grace_warned || t->grace_s < 0 || step_s + save_s <= t->grace_s) {
        return;
    }
    t->grace_warned = 1;
    zr_trainer_note(t, ZR_LOG_WARN,
                    "this checkpoint took %.1f s to save and a step %.1f s: a stop (Ctrl-C or "
                    "SIGTERM to mpirun) needs both within the %.0f s mpirun waits before SIGKILL "
                    "(odls_base_sigkill_timeout); launch with --mca odls_base_sigkill_timeout "
                    "%.0f or more, or the stop loses everything since the last checkpoint",
                    save_s, step_s, t->grace_s, 4 * (step_s + save_s) + 30);
}

zr_status zr_trainer_open_metrics(zr_trainer *t, int start)
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
        st = zr_metrics_start(&t->metrics, resumed, start, &dropped);
        if (st == ZR_OK && t->resume_event != NULL) {
            /* the settings changed at the resume, where the curve continues */
            st = zr_metrics_append(&t->metrics, t->resume_event);
        }
        if (st == ZR_OK && dropped > 0) {
            zr_trainer_note(t, ZR_LOG_INFO,
                            "%s: dropped %zu line%s after step %d, the step resumed from",
                            c->metrics_path, dropped, dropped == 1 ? "" : "s", start);
        }
    }
    return zr_comm_agree(&t->comm, st);
}
