/*
 * trainer_resume.c - zr_trainer_resume: continuing a run from a checkpoint.
 *
 * The checkpoint is --resume-from's, or the newest in the checkpoint dir (by
 * what its manifest says, zr_ckpt_find_latest). Its model shape must be this
 * run's (the message gives the flags that match it); so must every key the
 * key table marks MATCH, and the data unless zr.checkpoint.resume_new_data;
 * every other setting that changed is listed and recorded (check_changes).
 * What the manifest does not record is never "unchanged": it is named as not
 * compared, and held to the strict rule where one applies (data not recorded
 * is refused like other data). At another world size the checkpoint's global
 * batch is kept through gradient_accumulation_steps (keep_batch).
 * The engine state is loaded and resharded to this
 * world size (src/ckpt); the loader is placed by the token count, which
 * stays right when the world size changed. A damaged newest checkpoint is
 * not skipped silently: the error names the newest intact one and the flag
 * that continues from it. With --resume-from, later checkpoints are set
 * aside so that this run's saves cannot collide with them.
 */
#include "trainer_impl.h"

#include <cJSON.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

/* Checkpoint path's model must be this run's: each dimension that differs, by its key. */
static zr_status check_model(const zr_trainer *t, const char *path, const zr_gpt_config *m)
{
    const zr_gpt_config *r = &t->mcfg;
    char shown[160], shape[256];
    if (m->arch != r->arch) {
        zr_gpt_config_describe(m, shape, sizeof shape);
        ZR_FAIL(ZR_ERR_INVALID,
                "checkpoint %s is a %s model (%s), and this run builds a %s: resume with "
                "zr.model.init (--init) %s",
                zr_file_show(path, shown, sizeof shown),
                m->arch == ZR_ARCH_LLAMA ? "Llama-family" : "GPT-2", shape,
                r->arch == ZR_ARCH_LLAMA ? "Llama-family model" : "GPT-2 from the zr.model keys",
                m->arch == ZR_ARCH_LLAMA ? "the Hugging Face folder the run started from"
                                         : "left out, or the llm.c model file it started from");
    }
    const struct {
        const char *key, *flag;
        int was, now;
    } dims[] = {{"zr.model.layers", "--layers", m->layers, r->layers},
                {"zr.model.heads", "--heads", m->heads, r->heads},
                {"zr.model.channels", "--channels", m->channels, r->channels},
                {"zr.model.max_seq_len", "--max-seq-len", m->max_t, r->max_t},
                {"zr.model.vocab_size", "--vocab-size", m->vocab, r->vocab}};
    char diff[1024] = "", flags[512] = "";
    size_t used = 0, fused = 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].was != dims[i].now) {
            int k =
                snprintf(diff + used, sizeof diff - used, "%s%s is %d here, %d in the checkpoint",
                         used ? "; " : "", dims[i].key, dims[i].now, dims[i].was);
            used += k > 0 && (size_t)k < sizeof diff - used ? (size_t)k : 0;
            k = snprintf(flags + fused, sizeof flags - fused, "%s%s %d", fused ? " " : "",
                         dims[i].flag, dims[i].was);
            fused += k > 0 && (size_t)k < sizeof flags - fused ? (size_t)k : 0;
        }
    }
    if (used == 0 && zr_gpt_config_equal(m, r)) {
        return ZR_OK;
    }
    ZR_FAIL(ZR_ERR_INVALID,
            "checkpoint %s is for another model shape: %s; resume with the checkpoint's values "
            "(%s; checkpoints written before zr.model.max_seq_len existed have max_seq_len = "
            "seq_len)",
            zr_file_show(path, shown, sizeof shown),
            used ? diff
            : m->arch != r->arch
                ? (m->arch == ZR_ARCH_LLAMA
                       ? "the checkpoint is a Llama-family model, zr.model.init here is not"
                       : "the checkpoint is a GPT-2, zr.model.init here is a Llama-family folder")
            : m->arch == ZR_ARCH_LLAMA ? "the Llama shape (kv heads, head_dim, intermediate size, "
                                         "rope, norm eps, tying or biases) differs"
                                       : "the padded vocabulary differs",
            fused ? flags : "the same model keys");
}

/*
 * What a resume finds against the checkpoint: what is refused, what changed
 * (the start-up line, and the record of record_resume) and what could not be
 * compared because the checkpoint does not record it.
 */
typedef struct resume_diff {
    char refused[2048];
    char listed[4096];
    int nlisted;
    char unchecked[1024];
    int nunchecked;
    int no_config; /* the manifest has no "config" at all */
    int rebatched; /* gradient_accumulation_steps changed to keep the global batch */
    char batch_note[512];
    cJSON *changed;
} resume_diff;

/* Append sep-separated text to buf (what does not fit is cut, never overrun). */
__attribute__((format(printf, 4, 5))) static void append(char *buf, size_t n, const char *sep,
                                                         const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 1 >= n) {
        return;
    }
    if (used > 0) {
        snprintf(buf + used, n - used, "%s", sep);
        used = strlen(buf);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, n - used, fmt, ap);
    va_end(ap);
}

/* One "key was -> now" for the start-up line and the record. */
static void list_change(resume_diff *d, const char *key, const char *was, const char *now)
{
    append(d->listed, sizeof d->listed, ", ", "%s %s -> %s", key, was, now);
    d->nlisted++;
    cJSON *pair = cJSON_CreateArray();
    cJSON_AddItemToArray(pair, cJSON_CreateString(was));
    cJSON_AddItemToArray(pair, cJSON_CreateString(now));
    cJSON_AddItemToObject(d->changed, key, pair);
}

/* The default value of the key at path, as zr_config_compare prints it ("" if none). */
static void default_of(const char *path, char *buf, size_t n)
{
    static zr_train_config d; /* large (paths): not on the stack */
    zr_config_defaults(&d);
    char v[200];
    buf[0] = '\0';
    for (size_t i = 0; i < zr_config_key_count(); i++) {
        const char *p = zr_config_key_value(&d, i, v, sizeof v);
        if (p != NULL && strcmp(p, path) == 0) {
            snprintf(buf, n, "%s", v);
            return;
        }
    }
}

/*
 * A key the checkpoint's configuration does not record. The model's shape,
 * the seed and the data are compared from the manifest's own fields (which
 * every checkpoint has, or whose absence the data check refuses); a key that
 * must match, set here to other than its default, is refused, since it cannot
 * be shown to match; any other key is listed as not compared.
 */
static void unrecorded(resume_diff *d, const zr_config_change *ch)
{
    if (ch->policy == ZR_RESUME_MODEL || ch->policy == ZR_RESUME_DATA ||
        strcmp(ch->key, "zr.train.seed") == 0) {
        return;
    }
    char def[200];
    default_of(ch->key, def, sizeof def);
    if (ch->policy == ZR_RESUME_MATCH && strcmp(def, ch->now) != 0) {
        append(d->refused, sizeof d->refused, "; ",
               "%s is %s here, and the checkpoint does not record it, so it cannot be checked "
               "(a resume keeps the checkpoint's; leave it out)",
               ch->key, ch->now);
        return;
    }
    if (d->nunchecked++ < 24) {
        append(d->unchecked, sizeof d->unchecked, ", ", "%s", ch->key);
    }
}

/*
 * The data by what it holds: the same file under another name is the same
 * data. A checkpoint that does not record its data is held to the same rule
 * as one that records other data: refused unless zr.checkpoint.resume_new_data.
 */
static void check_data(const zr_trainer *t, const zr_ckpt_meta *meta, resume_diff *d)
{
    int known = meta->data[0] != '\0';
    if (known && strcmp(meta->data, t->data_id) == 0) {
        return;
    }
    if (t->cfg.resume_new_data) {
        list_change(d, "training data", known ? meta->data : "(not recorded)", t->data_id);
        return;
    }
    if (known) {
        append(d->refused, sizeof d->refused, "; ",
               "the training data is other data: %s here (zr.data.path \"%s\"), %s in the "
               "checkpoint; pass --resume-new-data (zr.checkpoint.resume_new_data) to train on "
               "it from here",
               t->data_id, t->cfg.data_path, meta->data);
    } else {
        append(d->refused, sizeof d->refused, "; ",
               "the checkpoint does not record its training data (no \"data\" in its manifest: "
               "an earlier zr, or an edited manifest), so %s here (zr.data.path \"%s\") cannot "
               "be checked against it; pass --resume-new-data (zr.checkpoint.resume_new_data) to "
               "train on it from here",
               t->data_id, t->cfg.data_path);
    }
}

/*
 * The record of this resume for the next manifests (history) and the metrics
 * file (event), from the checkpoint's own history and the changes.
 */
static zr_status record_resume(zr_trainer *t, const char *path, int64_t step, const char *old,
                               const cJSON *changed)
{
    cJSON *hist = old != NULL ? cJSON_Parse(old) : NULL;
    if (!cJSON_IsArray(hist)) {
        cJSON_Delete(hist);
        hist = cJSON_CreateArray();
    }
    cJSON *entry = cJSON_CreateObject(), *event = cJSON_CreateObject();
    cJSON_AddNumberToObject(entry, "step", (double)step);
    cJSON_AddStringToObject(entry, "from", path);
    cJSON_AddItemToObject(entry, "changed", cJSON_Duplicate(changed, 1));
    cJSON_AddItemToArray(hist, entry);
    cJSON_AddNumberToObject(event, "step", (double)step);
    cJSON_AddStringToObject(event, "event", "resume");
    cJSON_AddStringToObject(event, "from", path);
    cJSON_AddItemToObject(event, "changed", cJSON_Duplicate(changed, 1));
    char *h = cJSON_PrintUnformatted(hist), *e = cJSON_PrintUnformatted(event);
    cJSON_Delete(hist);
    cJSON_Delete(event);
    zr_status st = h != NULL && e != NULL ? ZR_OK : ZR_ERR_NOMEM;
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(t->history_json, strlen(h) + 1);
    }
    if (st == ZR_OK) {
        memcpy(t->history_json, h, strlen(h) + 1);
        st = ZR_ALLOC_STATUS(t->resume_event, strlen(e) + 2);
    }
    if (st == ZR_OK) {
        snprintf(t->resume_event, strlen(e) + 2, "%s\n", e);
    }
    cJSON_free(h);
    cJSON_free(e);
    if (st != ZR_OK) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory recording the resume from %s", path);
    }
    return ZR_OK;
}

/* A whole number of the saved configuration's top level (0 when absent or not one). */
static long long saved_int(const cJSON *root, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(it) || it->valuedouble < 1 || it->valuedouble > INT_MAX ||
        it->valuedouble != (double)(long long)it->valuedouble) {
        return 0;
    }
    return (long long)it->valuedouble;
}

/*
 * At another world size the checkpoint's global batch is kept, as universal
 * checkpointing does: train_batch_size stays the checkpoint's and
 * gradient_accumulation_steps follows (micro-batch x accumulation x ranks),
 * said in d->batch_note; where no whole accumulation gives it, refused naming
 * the three numbers. A train_batch_size given for this launch, or a
 * gradient_accumulation_steps given other than the checkpoint's, is the
 * user's choice of another batch and stays (listed as a change).
 */
static void keep_batch(zr_trainer *t, const zr_ckpt_meta *meta, const char *saved, resume_diff *d)
{
    zr_train_config *c = &t->cfg;
    cJSON *root = saved != NULL ? cJSON_Parse(saved) : NULL;
    long long tb = saved_int(root, "train_batch_size"),
              ga = saved_int(root, "gradient_accumulation_steps");
    cJSON_Delete(root);
    int own = (c->given & ZR_GIVEN_TRAIN_BATCH) ||
              ((c->given & ZR_GIVEN_GRAD_ACCUM) && c->gradient_accumulation_steps != ga);
    if (meta->world != t->world && tb == 0 && !own) {
        snprintf(d->batch_note, sizeof d->batch_note,
                 "the checkpoint does not record its train_batch_size, so the global batch "
                 "(%d at %d rank%s, the checkpoint saved at %d) could not be kept; set "
                 "train_batch_size to the checkpoint's",
                 c->train_batch_size, t->world, t->world == 1 ? "" : "s", meta->world);
        return;
    }
    if (meta->world == t->world || tb == 0 || own || tb == c->train_batch_size) {
        return;
    }
    long long mb = c->train_micro_batch_size_per_gpu, per = mb * t->world;
    if (tb % per != 0 || tb / per > (1 << 20)) {
        append(d->refused, sizeof d->refused, "; ",
               "the checkpoint's train_batch_size %lld (at %d rank%s) cannot be kept at %d "
               "rank%s with train_micro_batch_size_per_gpu %lld: it is not a whole number of "
               "%lld x %d; resume with a micro-batch or a world size whose product divides %lld, "
               "or set train_batch_size to train with another global batch",
               tb, meta->world, meta->world == 1 ? "" : "s", t->world, t->world == 1 ? "" : "s", mb,
               mb, t->world, tb);
        return;
    }
    snprintf(d->batch_note, sizeof d->batch_note,
             "at %d rank%s (the checkpoint's %d) gradient_accumulation_steps is %lld, not %d, to "
             "keep the checkpoint's train_batch_size %lld (micro-batch %lld x %lld x %d ranks); "
             "set train_batch_size to train with another",
             t->world, t->world == 1 ? "" : "s", meta->world, tb / per,
             c->gradient_accumulation_steps, tb, mb, tb / per, t->world);
    c->gradient_accumulation_steps = (int)(tb / per);
    c->train_batch_size = (int)tb;
    d->rebatched = 1;
}

/*
 * This run's configuration and data against the checkpoint's, key by key as
 * the key table decides (zr_config_policy): what must match is refused,
 * naming every such key with both values; the rest is listed in d and
 * recorded (record_resume); what the checkpoint does not record is listed in
 * d->unchecked, or refused where the rule for the key demands it.
 */
static zr_status check_changes(zr_trainer *t, const char *path, const zr_ckpt_meta *meta,
                               resume_diff *d)
{
    char *saved = NULL, *hist = NULL, shown[160];
    zr_config_change *ch = NULL;
    int nch = 0;
    memset(d, 0, sizeof *d);
    zr_status st = ZR_OK;
    d->changed = cJSON_CreateObject();
    if (d->changed == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory comparing with %s", path);
    }
    ZR_CHECK_GOTO(zr_ckpt_read_section(path, "config", &saved), st, done);
    ZR_CHECK_GOTO(zr_ckpt_read_section(path, "resumes", &hist), st, done);
    ZR_ALLOC_GOTO(ch, zr_config_key_count(), st, done);
    keep_batch(t, meta, saved, d);
    ZR_CHECK_GOTO(zr_config_compare(&t->cfg, saved, ch, &nch), st, done);
    for (int i = 0; i < nch; i++) {
        if (!ch[i].recorded) {
            unrecorded(d, &ch[i]);
        } else if (strcmp(ch[i].key, "zr.train.seed") == 0) {
            continue; /* the manifest's own seed, below */
        } else if (ch[i].policy == ZR_RESUME_MATCH) {
            append(d->refused, sizeof d->refused, "; ", "%s is %s here, %s in the checkpoint",
                   ch[i].key, ch[i].now, ch[i].was);
        } else {
            list_change(d, ch[i].key, ch[i].was, ch[i].now);
        }
    }
    if (meta->seed != t->cfg.seed) {
        append(d->refused, sizeof d->refused, "; ",
               "zr.train.seed is %llu here, %llu in the checkpoint",
               (unsigned long long)t->cfg.seed, (unsigned long long)meta->seed);
    }
    d->no_config = saved == NULL;
    check_data(t, meta, d);
    if (d->refused[0] != '\0') {
        ZR_FAIL_GOTO(st, done, ZR_ERR_INVALID,
                     "cannot resume from %s: %s; resume with the checkpoint's values",
                     zr_file_show(path, shown, sizeof shown), d->refused);
    }
    st = record_resume(t, path, meta->step, hist, d->changed);
done:
    cJSON_Delete(d->changed);
    d->changed = NULL;
    zr_free(ch);
    zr_free(saved);
    zr_free(hist);
    return st;
}

/*
 * The checkpoint dir once the run resumes from step: with --resume-from,
 * later checkpoints are set aside (this run's saves would collide with them);
 * what is named like a later checkpoint but is none is refused now, not at
 * the save it would block.
 */
static zr_status clear_ahead(zr_trainer *t, int explicit, int64_t step)
{
    zr_status st = ZR_OK;
    if (t->cfg.checkpoint_dir[0] == '\0') {
        return ZR_OK;
    }
    if (explicit && t->rank == 0) {
        st = zr_ckpt_set_aside_after(t->cfg.checkpoint_dir, step, zr_trainer_warn_ckpt, t);
    }
    if (st == ZR_OK && t->rank == 0) {
        st = zr_ckpt_check_ahead(t->cfg.checkpoint_dir, step);
    }
    return zr_comm_agree(&t->comm, st);
}

/* Rank 0's start-up lines of a resume. */
static void announce(zr_trainer *t, const char *path, const zr_ckpt_meta *meta,
                     const resume_diff *d)
{
    zr_trainer_note(t, ZR_LOG_INFO, "resumed from %s (step %lld, saved at %d rank%s, now %d)", path,
                    (long long)meta->step, meta->world, meta->world == 1 ? "" : "s", t->world);
    int n = d->nunchecked;
    if (d->batch_note[0] != '\0') {
        zr_trainer_note(t, d->rebatched ? ZR_LOG_INFO : ZR_LOG_WARN, "%s", d->batch_note);
    }
    if (d->no_config) {
        zr_trainer_note(t, ZR_LOG_WARN,
                        "%s records no configuration (an earlier zr, or an edited manifest): "
                        "%d settings could not be compared with this run's (the model's shape, "
                        "the seed and the data were)",
                        path, n);
    } else if (n > 0) {
        zr_trainer_note(t, ZR_LOG_WARN,
                        "%s does not record %d setting%s (an earlier zr, or an edited manifest), "
                        "which could not be compared with this run's: %s%s",
                        path, n, n == 1 ? "" : "s", d->unchecked, n > 24 ? ", ..." : "");
    }
    if (d->nlisted > 0) {
        zr_trainer_note(t, ZR_LOG_INFO,
                        "resuming step %lld of %s with %d setting%s changed: %s (recorded in the "
                        "next checkpoints' manifests and in the metrics file)",
                        (long long)meta->step, path, d->nlisted, d->nlisted == 1 ? "" : "s",
                        d->listed);
    } else if (n > 0 && !d->no_config) {
        zr_trainer_note(
            t, ZR_LOG_INFO,
            "resuming with the checkpoint's settings: none of those it records changed");
    } else if (n == 0) {
        zr_trainer_note(t, ZR_LOG_INFO, "resuming with the checkpoint's settings: none changed");
    }
    if (meta->step >= t->cfg.train_steps) {
        zr_trainer_note(t, ZR_LOG_INFO,
                        "the checkpoint is at or past zr.train.train_steps (%d); nothing to train",
                        t->cfg.train_steps);
    }
}

/*
 * A checkpoint dir that holds none but is itself a checkpoint (--ckpt-dir
 * ck/step_00000100 --resume): refused, not trained from step 0 with the
 * run's checkpoints written inside it.
 */
static zr_status not_a_checkpoint(const char *dir)
{
    zr_ckpt_meta meta;
    if (zr_ckpt_read_meta(dir, &meta) != ZR_OK) {
        zr_error_clear();
        return ZR_OK;
    }
    char parent[ZR_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash != NULL && slash != parent) {
        *slash = '\0';
    } else {
        snprintf(parent, sizeof parent, "%s", slash == parent ? "/" : ".");
    }
    ZR_FAIL(ZR_ERR_INVALID,
            "zr.checkpoint.dir %s is a checkpoint (step %lld), not a folder of checkpoints: "
            "resume with --ckpt-dir %s --resume (its newest checkpoint) or --resume-from %s",
            dir, (long long)meta.step, parent, dir);
}

/*
 * Restore from --resume-from or the newest checkpoint; *start = first step
 * to run.
 */
static zr_status resume_at(zr_trainer *t, int *start)
{
    char path[ZR_PATH_MAX];
    int found = 0, explicit = t->cfg.resume_from[0] != '\0';
    static resume_diff d; /* large: not on the stack */
    *start = 0;
    zr_status st = ZR_OK;
    if (explicit) {
        snprintf(path, sizeof path, "%s", t->cfg.resume_from);
        found = 1;
    } else {
        /* rank 0 reports what is named like a checkpoint but is none */
        st = zr_ckpt_find_latest(t->cfg.checkpoint_dir, path, sizeof path, &found,
                                 zr_trainer_warn_ckpt, t);
    }
    if (st == ZR_OK && !found) {
        st = not_a_checkpoint(t->cfg.checkpoint_dir);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    if (!found) {
        ZR_CHECK(clear_ahead(t, 0, 0));
        zr_trainer_note(t, ZR_LOG_WARN, "no checkpoint in %s; starting from step 0",
                        t->cfg.checkpoint_dir);
        return ZR_OK;
    }
    zr_ckpt_meta meta;
    st = zr_ckpt_read_meta(path, &meta);
    if (st == ZR_OK) {
        st = check_model(t, path, &meta.model);
    }
    if (st == ZR_OK && meta.step > INT_MAX) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "checkpoint %s is at step %lld, beyond the last step zr train can run "
                         "(%d)",
                         path, (long long)meta.step, INT_MAX);
    }
    if (st == ZR_OK) {
        st = check_changes(t, path, &meta, &d);
    }
    if (st == ZR_OK && d.rebatched) {
        /* the manifests record the accumulation this run uses; a step must fit the data */
        zr_free(t->config_json);
        t->config_json = NULL;
        st = zr_config_to_json(&t->cfg, &t->config_json);
        if (st == ZR_OK) {
            st = zr_trainer_check_accum(t);
        }
    }
    st = zr_comm_agree(&t->comm, st);
    if (st == ZR_OK) {
        st = zr_ckpt_load(&t->comm, &t->engine, path, &meta);
    }
    if (st == ZR_ERR_FORMAT || st == ZR_ERR_IO) {
        return explicit ? st : damaged_hint(t, path, step_of(path), st);
    }
    ZR_CHECK(st);
    if (meta.note[0] != '\0') {
        zr_trainer_note(t, ZR_LOG_INFO, "%s", meta.note); /* qgZ's residuals start from zero */
    }
    ZR_CHECK(clear_ahead(t, explicit, meta.step));
    /* the checkpoint's tokens are windows consumed x T (of any world size and batch: earlier
       checkpoints counted global batches x world x B x T, the same number) */
    zr_loader_seek_windows(&t->train, meta.tokens / (uint64_t)t->cfg.seq_len);
    *start = (int)meta.step;
    t->resumed_from = meta.step;
    announce(t, path, &meta, &d);
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
