/*
 * zr/checkpoint.h - sharded training checkpoints that never lose state and
 * load at any world size.
 *
 * Layout of one checkpoint (a directory under the checkpoint dir):
 *
 *   step_00000100/
 *     manifest.json      world size, plan, model config, unit layout, step,
 *                        tokens consumed, seed, the run's configuration, and
 *                        the size and CRC-32C of every rank file
 *     rank_00000.bin     rank r's slice [r*S, (r+1)*S) of every unit's fp32
 *     rank_00001.bin     master weights, Adam m and v, then (with qgZ error
 *     ...                feedback) the rank's qgZ residuals, then a CRC-32C trailer
 *     COMPLETE           the manifest's CRC-32C, written last
 *
 * Writing: the whole checkpoint is built in "step_N.partial": every rank
 * writes its file through a temporary name (fsync, rename); the ranks agree
 * on success; rank 0 writes the manifest, then COMPLETE, fsyncs the folder
 * and renames it to "step_N" (the single commit point), then fsyncs the
 * parent. Old checkpoints beyond keep are renamed to "step_M.deleting"
 * before their files go, so a listed checkpoint is never half removed; only
 * the files its manifest lists go (a folder that also holds a user's file
 * stays, as "step_M.user-files", with a warning). A
 * crash at any point leaves complete checkpoints and at most leftovers with
 * a suffix, which zr_ckpt_recover clears; an existing checkpoint is never
 * overwritten.
 *
 * Fault injection: ZR_FAULT_SAVE=k (any save) or k@N (the save of step N)
 * makes world rank 0 SIGKILL itself at stage k of the save, to test that a
 * crash anywhere resumes; k[@N]:R the same on world rank R, and
 * k[@N]:R:fail makes that stage fail there with an I/O error instead, to test
 * that a failure anywhere ends every rank at once with its message (ranks
 * other than 0 reach stages 1, before the first agreement; 2, their own
 * file; and 3, while rank 0 commits):
 *   1 step_N.partial created, empty      6 renamed to step_N, parent not fsynced
 *   2 rank 0's file still rank_*.tmp     7 the oldest renamed to step_M.deleting
 *   3 every rank file in place           8 one file of step_M.deleting removed
 *   4 manifest.json in place             9 rank 0 done, ranks not yet agreed
 *   5 COMPLETE in place, not renamed
 *
 * Loading trusts nothing it can check: every manifest field is checked for
 * its JSON type and range (counts are 64-bit, exact up to 2^53), unknown or
 * repeated keys are refused, the units must be the model's, and every rank
 * file must have the manifest's size and a header naming its rank, world,
 * unit count and step; the CRC of every rank file read is verified, and in
 * the same pass every value: a NaN or an infinity is refused, naming the
 * file, the array (master weights, Adam m or v, qgZ residuals), the tensor
 * and the element; a save refuses to write one. qgZ's residuals are the
 * rank's own: restored at the layout they were saved at (world size, ranks
 * per node, bits, group), otherwise they start from zero and
 * zr_ckpt_meta.note says so. Slices
 * are canonical (the same at every stage), so a checkpoint saved at W ranks
 * loads at W' ranks: each new rank reads the pieces of the old slices that
 * cover its new slice.
 */
#ifndef ZR_CHECKPOINT_H
#define ZR_CHECKPOINT_H

#include "zr/model.h"
#include "zr/zero.h"

#define ZR_CKPT_VERSION 1

typedef struct zr_ckpt_meta {
    int64_t step;        /* training steps completed */
    int64_t optim_steps; /* optimizer steps taken (AdamW's t; skipped steps excluded) */
    uint64_t tokens;     /* tokens consumed (global), to reposition after resharding */
    uint64_t seed;
    int world; /* ranks that wrote it (filled by save/read) */
    int stage;
    zr_gpt_config model;
    char
        data[192]; /* what the run trained on ("text, 1234 tokens, ends CRC-32C ..."); "" unknown */
    /* zr_ckpt_load: a one-line note for the user ("" none): qgZ's residuals start from zero */
    char note[512];
} zr_ckpt_meta;

/* What a save records beside the state, and how it rotates. */
typedef struct zr_ckpt_save_opts {
    const char *config_json;  /* the run's effective configuration (JSON object), or NULL */
    const char *history_json; /* the resumes that led here (JSON array, see below), or NULL */
    int keep;                 /* > 0: keep this many of zr's checkpoints, the newest */
    int64_t protect;          /* a step rotation never deletes (the one resumed from); -1 none */
} zr_ckpt_save_opts;

/*
 * Save a checkpoint of engine e as "<dir>/step_<meta->step>". Collective.
 * The manifest records opts->config_json and opts->history_json: an array
 * with one object per resume that led to this state, oldest first:
 *   {"step": 40, "from": "ckpt/step_00000040", "changed": {"key": ["was", "now"], ...}}
 * so that it never claims a provenance it does not have. keep > 0 then
 * deletes the oldest checkpoints beyond keep among those zr wrote and
 * verified, older than this one, never opts->protect. On any failure every
 * rank returns the same error and no existing checkpoint is touched.
 * *path_out (may be NULL) receives the checkpoint path.
 */
zr_status zr_ckpt_save(zr_comm *c, zr_engine *e, const char *dir, const zr_ckpt_meta *meta,
                       const zr_ckpt_save_opts *opts, char *path_out, size_t path_len);

/*
 * The newest checkpoint under dir: the highest step among the folders whose
 * manifest passes its checks and whose name is the one zr gives that step
 * (step_%08lld). Anything else named like a checkpoint (a symbolic link, a
 * copy or rename under another step's name) is reported through warn (NULL:
 * ZR_WARN) and left alone. A folder with a checkpoint's name and marker but
 * a manifest that fails is taken when it is the newest, so that loading it
 * says why. *found = 0 (and ZR_OK) when there is none; a missing dir has none.
 */
typedef void (*zr_ckpt_warn_fn)(void *ctx, const char *msg);
zr_status zr_ckpt_find_latest(const char *dir, char *path, size_t len, int *found,
                              zr_ckpt_warn_fn warn, void *ctx);

/*
 * Refuse (ZR_ERR_INVALID, naming each) what stands in dir under the name of
 * a checkpoint of a step after step but is not one zr can use (a link, a
 * copy or rename under another step's name): a save of a run starting at
 * step would collide with it, and zr leaves alone what it did not write, so
 * the run is refused before its first step rather than at that save.
 */
zr_status zr_ckpt_check_ahead(const char *dir, int64_t step);

/*
 * Newest checkpoint under dir older than step before (any step if before < 0)
 * that passes zr_ckpt_verify; *found = 0 when there is none. For the message
 * that names the checkpoint to fall back on when the newest is damaged.
 */
zr_status zr_ckpt_find_intact(const char *dir, int64_t before, char *path, size_t len, int *found);

/* Validate a checkpoint completely: manifest, rank file headers and every CRC (no MPI). */
zr_status zr_ckpt_verify(const char *path);

/*
 * Clear what crashed saves left in dir, with a warning for each: an
 * unfinished "step_N.partial" or "step_M.deleting" is removed (the files zr
 * wrote; one that holds anything else stays as "step_N.user-files"), a "step_N"
 * without COMPLETE (only older zr versions left those) is moved aside to
 * "step_N.incomplete". Call on one rank while holding the directory's lock.
 */
zr_status zr_ckpt_recover(const char *dir, zr_ckpt_warn_fn warn, void *ctx);

/*
 * Move every complete checkpoint in dir newer than step aside to
 * "step_N.set-aside" (nothing is deleted), so that a run resumed from an
 * older checkpoint can save its own step_N. One rank, lock held.
 */
zr_status zr_ckpt_set_aside_after(const char *dir, int64_t step, zr_ckpt_warn_fn warn, void *ctx);

/* The lock file inside a checkpoint dir; it holds "pid P on host H, started T". */
#define ZR_CKPT_LOCK_FILE "zr.lock"

typedef struct zr_ckpt_dir_lock {
    int fd;            /* -1: not held */
    int dir_known;     /* dev and ino hold the folder's, as it was locked */
    uint64_t dev, ino; /* told apart from a folder made under its name later */
} zr_ckpt_dir_lock;

/*
 * Take an exclusive, non-blocking flock on dir/zr.lock (creating dir) for as
 * long as the process lives or until zr_ckpt_unlock, and write who holds it
 * into the file. If another process holds it, fails with ZR_ERR_INVALID and
 * a message naming the holder. On a file system without locks: a warning,
 * ZR_OK, lk->fd = -1. Take it on one rank.
 */
zr_status zr_ckpt_lock(const char *dir, zr_ckpt_dir_lock *lk);
void zr_ckpt_unlock(zr_ckpt_dir_lock *lk);

/*
 * Is dir still the folder locked by lk, its lock file the one held? ZR_ERR_IO naming it when it
 * was deleted, moved or replaced under the run (a save would re-create it without the lock).
 */
zr_status zr_ckpt_lock_check(const char *dir, const zr_ckpt_dir_lock *lk);

/* Read and validate a checkpoint's manifest (no MPI needed). */
zr_status zr_ckpt_read_meta(const char *path, zr_ckpt_meta *meta);

/*
 * A section of a checkpoint's checked manifest as JSON text ("config": the
 * run's configuration, "resumes": its history), from the counted allocator
 * (free with zr_free); *out = NULL when the manifest has no such section.
 */
zr_status zr_ckpt_read_section(const char *path, const char *section, char **out);

/*
 * Load a checkpoint into engine e (any world size and stage); the engine's
 * units must match the checkpoint's model. Collective; errors agree across
 * ranks. Fills meta.
 */
zr_status zr_ckpt_load(zr_comm *c, zr_engine *e, const char *path, zr_ckpt_meta *meta);

/*
 * Read the full fp32 master weights of unit u (numel elements) from a
 * checkpoint, verifying the rank files it reads (for zr export; no MPI).
 */
zr_status zr_ckpt_read_unit(const char *path, const zr_ckpt_meta *meta, int u, float *full);

#endif /* ZR_CHECKPOINT_H */
