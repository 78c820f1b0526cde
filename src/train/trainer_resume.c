/*
 * trainer_resume.c - zr_trainer_resume: continuing a run from a checkpoint.
 *
 * The checkpoint is --resume-from's, or the newest in the checkpoint dir (by
 * what its manifest says, zr_ckpt_find_latest). Its model shape must be this
 * run's (the message gives the flags that match it); so must every key the
 * key table marks MATCH, and the data unless zr.checkpoint.resume_new_data;
 * every other setting that changed is listed and recorded (check_changes).
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
    if (used == 0 && memcmp(m, r, sizeof *m) == 0) {
        return ZR_OK;
    }
    char shown[160];
    ZR_FAIL(ZR_ERR_INVALID,
            "checkpoint %s is for another model shape: %s; resume with the checkpoint's values "
            "(%s; checkpoints written before zr.model.max_seq_len existed have max_seq_len = "
            "seq_len)",
            zr_file_show(path, shown, sizeof shown), used ? diff : "the padded vocabulary differs",
            fused ? flags : "the same model keys");
}

/* One "key was -> now" for the start-up line, appended to buf; *count counts them. */
static void list_change(char *buf, size_t n, int *count, const char *key, const char *was,
                        const char *now)
{
    size_t used = strlen(buf);
    if (used + 8 < n) {
        snprintf(buf + used, n - used, "%s%s %s -> %s", used ? ", " : "", key, was, now);
    }
    (*count)++;
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

/*
 * This run's configuration and data against the checkpoint's, key by key as
 * the key table decides (zr_config_policy): what must match is refused,
 * naming every such key with both values; the rest is listed in *listed and
 * recorded (record_resume).
 */
static zr_status check_changes(zr_trainer *t, const char *path, const zr_ckpt_meta *meta,
                               char *listed, size_t n, int *nlisted)
{
    char *saved = NULL, *hist = NULL, refused[2048] = "", shown[160];
    zr_config_change *ch = NULL;
    cJSON *changed = NULL;
    int nch = 0;
    listed[0] = '\0';
    *nlisted = 0;
    zr_status st = ZR_OK;
    ZR_CHECK_GOTO(zr_ckpt_read_section(path, "config", &saved), st, done);
    ZR_CHECK_GOTO(zr_ckpt_read_section(path, "resumes", &hist), st, done);
    ZR_ALLOC_GOTO(ch, zr_config_key_count(), st, done);
    if (saved != NULL) {
        ZR_CHECK_GOTO(zr_config_compare(&t->cfg, saved, ch, &nch), st, done);
    }
    changed = cJSON_CreateObject();
    for (int i = 0; i < nch; i++) {
        if (ch[i].policy == ZR_RESUME_MATCH) {
            size_t u = strlen(refused);
            snprintf(refused + u, sizeof refused - u, "%s%s is %s here, %s in the checkpoint",
                     u ? "; " : "", ch[i].key, ch[i].now, ch[i].was);
            continue;
        }
        list_change(listed, n, nlisted, ch[i].key, ch[i].was, ch[i].now);
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(ch[i].was));
        cJSON_AddItemToArray(pair, cJSON_CreateString(ch[i].now));
        cJSON_AddItemToObject(changed, ch[i].key, pair);
    }
    /* the data by what it holds: the same file under another name is the same data */
    if (meta->data[0] != '\0' && strcmp(meta->data, t->data_id) != 0) {
        if (!t->cfg.resume_new_data) {
            size_t u = strlen(refused);
            snprintf(refused + u, sizeof refused - u,
                     "%sthe training data is other data: %s here (zr.data.path \"%s\"), %s in the "
                     "checkpoint; pass --resume-new-data (zr.checkpoint.resume_new_data) to train "
                     "on it from here",
                     u ? "; " : "", t->data_id, t->cfg.data_path, meta->data);
        } else {
            list_change(listed, n, nlisted, "training data", meta->data, t->data_id);
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateString(meta->data));
            cJSON_AddItemToArray(pair, cJSON_CreateString(t->data_id));
            cJSON_AddItemToObject(changed, "training data", pair);
        }
    }
    if (refused[0] != '\0') {
        ZR_FAIL_GOTO(st, done, ZR_ERR_INVALID,
                     "cannot resume from %s: %s; resume with the checkpoint's values",
                     zr_file_show(path, shown, sizeof shown), refused);
    }
    st = record_resume(t, path, meta->step, hist, changed);
done:
    cJSON_Delete(changed);
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
static void announce(zr_trainer *t, const char *path, const zr_ckpt_meta *meta, const char *listed,
                     int changes)
{
    zr_trainer_note(t, ZR_LOG_INFO, "resumed from %s (step %lld, saved at %d rank%s, now %d)", path,
                    (long long)meta->step, meta->world, meta->world == 1 ? "" : "s", t->world);
    if (changes > 0) {
        zr_trainer_note(t, ZR_LOG_INFO,
                        "resuming step %lld of %s with %d setting%s changed: %s (recorded in the "
                        "next checkpoints' manifests and in the metrics file)",
                        (long long)meta->step, path, changes, changes == 1 ? "" : "s", listed);
    } else {
        zr_trainer_note(t, ZR_LOG_INFO, "resuming with the checkpoint's settings: none changed");
    }
    if (meta->step >= t->cfg.train_steps) {
        zr_trainer_note(t, ZR_LOG_INFO,
                        "the checkpoint is at or past zr.train.train_steps (%d); nothing to train",
                        t->cfg.train_steps);
    }
}

/*
 * Restore from --resume-from or the newest checkpoint; *start = first step
 * to run.
 */
static zr_status resume_at(zr_trainer *t, int *start)
{
    char path[ZR_PATH_MAX], listed[4096];
    int found = 0, explicit = t->cfg.resume_from[0] != '\0', changes = 0;
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
        st = check_changes(t, path, &meta, listed, sizeof listed, &changes);
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
    /* the loader counts global micro-batches, whose size may differ after resharding;
       the token count places it at the same point of the data either way */
    uint64_t global_tokens =
        (uint64_t)t->world * t->cfg.train_micro_batch_size_per_gpu * t->cfg.seq_len;
    zr_loader_seek(&t->train, meta.tokens / global_tokens);
    *start = (int)meta.step;
    t->resumed_from = meta.step;
    announce(t, path, &meta, listed, changes);
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
