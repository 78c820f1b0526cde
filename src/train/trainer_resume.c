/*
 * trainer_resume.c - zr_trainer_resume: continuing a run from a checkpoint.
 *
 * The checkpoint is --resume-from's, or the newest complete one in the
 * checkpoint dir. Its model shape must be this run's (the message gives the
 * flags that match it); the engine state is loaded and resharded to this
 * world size (src/ckpt); the loader is placed by the token count, which
 * stays right when the world size changed. A damaged newest checkpoint is
 * not skipped silently: the error names the newest intact one and the flag
 * that continues from it. With --resume-from, later checkpoints are set
 * aside so that this run's saves cannot collide with them.
 */
#include "trainer_impl.h"

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
        zr_trainer_note(t, ZR_LOG_WARN, "no complete checkpoint in %s; starting from step 0",
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
        st = t->rank == 0 ? zr_ckpt_set_aside_after(t->cfg.checkpoint_dir, meta.step,
                                                    zr_trainer_warn_ckpt, t)
                          : ZR_OK;
        ZR_CHECK(zr_comm_agree(&t->comm, st));
    }
    /* the loader counts global micro-batches, whose size may differ after resharding;
       the token count places it at the same point of the data either way */
    uint64_t global_tokens =
        (uint64_t)t->world * t->cfg.train_micro_batch_size_per_gpu * t->cfg.seq_len;
    zr_loader_seek(&t->train, meta.tokens / global_tokens);
    *start = (int)meta.step;
    zr_trainer_note(t, ZR_LOG_INFO, "resumed from %s (step %lld, saved at %d ranks, now %d)", path,
                    (long long)meta.step, meta.world, t->world);
    if (meta.step >= t->cfg.train_steps) {
        zr_trainer_note(t, ZR_LOG_INFO,
                        "the checkpoint is at or past zr.train.train_steps (%d); nothing to train",
                        t->cfg.train_steps);
    }
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
