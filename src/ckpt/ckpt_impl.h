/*
 * ckpt_impl.h - what the checkpoint files of src/ckpt share (not public).
 *
 *   checkpoint.c  rank files: saving them, checking their headers, reading
 *                 and resharding their slices; zr_ckpt_save / load / verify
 *   manifest.c    manifest.json: writing it, and reading it back with every
 *                 field checked (one reader per section)
 *   feedback.c    qgZ's error-feedback residuals in rank files and manifests
 *   ckpt_dir.c    the checkpoint directory: listing, rotation, recovery of
 *                 crashed saves, setting aside, the lock
 */
#ifndef ZR_CKPT_IMPL_H
#define ZR_CKPT_IMPL_H

#include "zr/checkpoint.h"

#include <stdint.h>

/* Size of a rank file's header; the units' slices start right after it. */
#define ZR_CKPT_HEADER_BYTES 64

/* Format a path; a path that does not fit is an error, never a silent truncation. */
zr_status zr_ckpt_pathf(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Save stages (ZR_FAULT_SAVE=k): what is on disk when rank 0 dies there. The
 * other ranks reach stage 1 (before the first agreement), 2 (their own file)
 * and 3 (while rank 0 commits, before the last agreement).
 */
enum {
    ZR_CKPT_FAULT_PARTIAL_MADE = 1, /* step_N.partial exists, empty */
    ZR_CKPT_FAULT_RANK_TMP = 2,     /* rank 0's file written as rank_00000.bin.tmp, not renamed */
    ZR_CKPT_FAULT_RANK_FILES = 3,   /* every rank file in step_N.partial, no manifest */
    ZR_CKPT_FAULT_MANIFEST = 4,     /* manifest.json in step_N.partial, no COMPLETE */
    ZR_CKPT_FAULT_COMPLETE = 5,     /* COMPLETE in step_N.partial, not yet renamed */
    ZR_CKPT_FAULT_RENAMED = 6,      /* step_N in place, parent directory not yet fsynced */
    ZR_CKPT_FAULT_ROTATE_MOVED = 7, /* oldest renamed to step_M.deleting, nothing removed */
    ZR_CKPT_FAULT_ROTATE_HALF = 8,  /* one file of step_M.deleting removed */
    ZR_CKPT_FAULT_DONE = 9,         /* rank 0 finished, before the ranks' final agreement */
};

/*
 * SIGKILL world rank `rank` here, or return ZR_ERR_IO, if ZR_FAULT_SAVE asks for
 * this stage (of this step) on this rank; otherwise ZR_OK.
 */
zr_status zr_ckpt_fault_point(int stage, int64_t step, int rank);

/* ZR_SLOW_SAVE=S: every rank sleeps S seconds here (fault.c). */
void zr_ckpt_slow_point(void);

/* ---- the directory (ckpt_dir.c) ---------------------------------------------------- */

int zr_ckpt_exists(const char *path);

/*
 * Remove what zr wrote in a checkpoint-like folder (one level deep): its
 * manifest, its marker, the rank files the manifest lists (any rank_N.bin
 * without a readable manifest) and their temporary names, regular files
 * only, never through a link; then the folder when that emptied it. A folder
 * that holds anything else stays, renamed step_N.user-files, with a warning
 * (ZR_WARN) naming it. fault > 0: zr_ckpt_fault_point(fault) after the first
 * file is gone, so a test can stop a removal halfway (or fail it: the only
 * failure returned).
 */
zr_status zr_ckpt_remove_dir(const char *path, int fault, int64_t step);

/*
 * Delete the oldest checkpoints beyond keep (the one just saved, current,
 * counts): only checkpoints zr wrote and whose manifest checks, older than
 * current, never protect (-1: none).
 */
zr_status zr_ckpt_rotate(const char *dir, int64_t current, int keep, int64_t protect);

/* ---- the manifest (manifest.c) ----------------------------------------------------- */

typedef struct zr_ckpt_unit_layout {
    size_t numel, padded, shard;
    uint64_t offset;    /* byte offset of the unit's master slice in a rank file */
    size_t fb[2];       /* qgZ's residuals of the unit in each rank file: hop 0, hop 1 */
    uint64_t fb_offset; /* byte offset of the hop 0 residuals (hop 1's follow) */
} zr_ckpt_unit_layout;

/*
 * The optional "qgz_feedback" section: each rank file then ends (before its
 * checksum) with its rank's error-feedback residuals, unit by unit, hop 0
 * then hop 1. They belong to the rank's place in the layout recorded here.
 */
typedef struct zr_ckpt_feedback {
    int present;
    int ranks_per_node, bits, group;
} zr_ckpt_feedback;

/* What a manifest says: the meta, the unit layout and the rank files' size and CRCs. */
typedef struct zr_ckpt_manifest {
    zr_ckpt_meta meta;
    int nunits;
    zr_ckpt_unit_layout *lay;
    zr_ckpt_feedback fb;
    uint32_t *crcs;
    uint64_t file_bytes; /* every rank file has this size */
} zr_ckpt_manifest;

/* The manifest of engine e's checkpoint as JSON text (free with cJSON_free); NULL: no memory. */
char *zr_ckpt_manifest_text(zr_engine *e, const zr_ckpt_meta *meta, const zr_ckpt_save_opts *o,
                            const uint32_t *crcs, const uint64_t *bytes);

/*
 * Read the manifest of checkpoint path: the folder and its COMPLETE marker
 * exist, the marker's checksum matches, and every field has its type and
 * range and agrees with the model. The rank files are not looked at.
 */
zr_status zr_ckpt_manifest_read(const char *path, zr_ckpt_manifest *m);
/* The same, also returning a section as unformatted JSON text (zr_free; NULL if absent). */
zr_status zr_ckpt_manifest_read_section(const char *path, zr_ckpt_manifest *m, const char *section,
                                        char **out);
void zr_ckpt_manifest_free(zr_ckpt_manifest *m);

/* ---- a Llama-family model's shape (manifest_llama.c) ---------------------------------- */

/* "model.llama" of a manifest (NULL: no memory). */
struct cJSON *zr_ckpt_llama_json(const zr_llama_config *l);
/* The same read back: every key present, of its kind and range, and no other. */
zr_status zr_ckpt_llama_read(const struct cJSON *o, const char *mpath, zr_llama_config *l);

/* ---- qgZ's residuals (feedback.c) ------------------------------------------------------ */

/* Engine e's checkpoints hold its qgZ residuals (zr.quant.qgz_error_feedback is on). */
int zr_ckpt_feedback_saved(const zr_engine *e);

/* The manifest's "qgz_feedback" section for engine e (NULL: no memory). */
struct cJSON *zr_ckpt_feedback_json(zr_engine *e);

/*
 * 1 when engine e keeps residuals and can take those of checkpoint path (m):
 * it holds them, saved at this run's layout (world size, ranks per node,
 * bits and group of the quantization). 0 otherwise, with a one-line note in
 * note ("" when the run keeps none) saying that they start from zero and why.
 */
int zr_ckpt_feedback_usable(const zr_engine *e, const zr_ckpt_manifest *m, const char *path,
                            char *note, size_t len);

#endif /* ZR_CKPT_IMPL_H */
