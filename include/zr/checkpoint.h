/*
 * zr/checkpoint.h - sharded training checkpoints that never lose state and
 * load at any world size.
 *
 * Layout of one checkpoint (a directory under the checkpoint dir):
 *
 *   step_00000100/
 *     manifest.json      world size, plan, model config, unit layout, step,
 *                        data position, seed, the run's configuration, and the
 *                        size and CRC-32C of every rank file
 *     rank_00000.bin     rank r's slice [r*S, (r+1)*S) of every unit's fp32
 *     rank_00001.bin     master weights, Adam m and v, then a CRC-32C trailer
 *     ...
 *     COMPLETE           written last, only after every rank succeeded
 *
 * Writing: every file goes to a temporary name in "step_N.partial", is
 * fsynced and renamed; ranks agree on success; rank 0 writes the manifest,
 * renames the directory to "step_N", writes COMPLETE and fsyncs the parent.
 * A crash at any point leaves either an ignored ".partial" directory or a
 * complete checkpoint; an existing checkpoint is never overwritten.
 *
 * Loading verifies the manifest, COMPLETE and the CRC of every rank file it
 * reads. Slices are canonical (the same at every stage), so a checkpoint
 * saved at W ranks loads at W' ranks: each new rank reads the pieces of the
 * old slices that cover its new slice.
 */
#ifndef ZR_CHECKPOINT_H
#define ZR_CHECKPOINT_H

#include "zr/model.h"
#include "zr/zero.h"

#define ZR_CKPT_VERSION 1

typedef struct zr_ckpt_meta {
    int64_t step;           /* training steps completed */
    int64_t optim_steps;    /* optimizer steps taken (AdamW's t; skipped steps excluded) */
    uint64_t data_position; /* global batches consumed by the train loader */
    uint64_t tokens;        /* tokens consumed (global), to reposition after resharding */
    uint64_t seed;
    int world;              /* ranks that wrote it (filled by save/read) */
    int stage;
    zr_gpt_config model;
} zr_ckpt_meta;

/*
 * Save a checkpoint of engine e as "<dir>/step_<meta->step>". Collective.
 * config_json (may be NULL) is stored in the manifest for reference. keep > 0
 * deletes the oldest complete checkpoints beyond keep after success. On any
 * failure every rank returns the same error and no existing checkpoint is
 * touched. *path_out (may be NULL) receives the checkpoint path.
 */
zr_status zr_ckpt_save(zr_comm *c, zr_engine *e, const char *dir, const zr_ckpt_meta *meta,
                       const char *config_json, int keep, char *path_out, size_t path_len);

/*
 * Newest complete checkpoint under dir. *found = 0 (and ZR_OK) when there is
 * none; a missing dir is "none".
 */
zr_status zr_ckpt_find_latest(const char *dir, char *path, size_t len, int *found);

/* Read and validate a checkpoint's manifest (no MPI needed). */
zr_status zr_ckpt_read_meta(const char *path, zr_ckpt_meta *meta);

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
