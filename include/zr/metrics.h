/*
 * zr/metrics.h - the JSON-lines metrics file of "zr train" (one object per
 * line) and its reader, used by "zr plot".
 *
 * A line is an object with at least "step" and, for a training step, "loss"
 * and "tokens_per_s"; "val_loss" and "lr" are optional. A line holding
 * "val_loss" may leave out "loss" and "tokens_per_s" (a validation-only
 * line). Other fields are allowed and ignored, so the trainer may add more.
 * A number may be null where the trainer had no finite value; it reads as NaN.
 * A line with "event" records something that happened at its step (a resume,
 * with the settings it changed: {"step": 40, "event": "resume", "from":
 * "ckpt/step_00000040", "changed": {"optimizer.params.lr": ["0.001", "0.01"]}})
 * and is no point of a curve.
 */
#ifndef ZR_METRICS_H
#define ZR_METRICS_H

#include "zr/base.h"
#include "zr/file.h"

#include <stdio.h>

typedef struct zr_metrics_point {
    long long step;
    double loss;         /* NaN if absent or null */
    double tokens_per_s; /* NaN if absent or null */
    double val_loss;     /* NaN if absent or null */
    double lr;           /* NaN if absent or null */
    int event;           /* 1: an event line (a resume), not a point; the other fields unset */
} zr_metrics_point;

typedef struct zr_metrics_series {
    char name[256];           /* label of the run: the file's directory name */
    zr_metrics_point *points; /* zr_alloc'd, in file order; freed by zr_metrics_free */
    size_t count, cap;
} zr_metrics_series;

/*
 * Parse one line (without its newline) into *out. file and lineno only name
 * the line in messages. ZR_ERR_FORMAT for malformed JSON, a line that is not
 * an object, a missing or non-integer "step", a missing "loss" or
 * "tokens_per_s" on a training line, or a field of the wrong type.
 */
zr_status zr_metrics_parse_line(const char *line, const char *file, int lineno,
                                zr_metrics_point *out);

/*
 * Read a whole metrics file into *out (which it initializes; free with
 * zr_metrics_free, also after a failure). Blank lines are skipped. A last
 * line without its newline that does not parse is skipped too: the run is
 * probably still writing it. ZR_ERR_IO if the file cannot be read,
 * ZR_ERR_FORMAT naming file:line for a bad line or a file without any.
 */
zr_status zr_metrics_read(const char *path, zr_metrics_series *out);

void zr_metrics_free(zr_metrics_series *s);

/* The label of a run from its metrics path: "runs/a/metrics.jsonl" -> "a". */
void zr_metrics_label(const char *path, char *buf, size_t n);

/*
 * One metrics line being built: {"step": N, "key": value, ...}. Floats are
 * written with enough digits to read back exactly (%.9g for a float, %.17g
 * for a double) and non-finite values as null, so every line is JSON.
 */
typedef struct zr_metrics_line {
    char text[2048];
    size_t len;
} zr_metrics_line;

void zr_metrics_line_begin(zr_metrics_line *l, long long step);
void zr_metrics_line_i64(zr_metrics_line *l, const char *key, long long v);
void zr_metrics_line_f32(zr_metrics_line *l, const char *key, float v);
void zr_metrics_line_f64(zr_metrics_line *l, const char *key, double v);
/* Close the object and add the newline; returns the text. */
const char *zr_metrics_line_end(zr_metrics_line *l);

/* Write one point as a line that zr_metrics_parse_line reads back (NaN as null). */
zr_status zr_metrics_write(FILE *f, const zr_metrics_point *p);

/* The metrics file of a running job. */
typedef struct zr_metrics_file {
    FILE *f;     /* open for appending (zr_metrics_start), or NULL */
    int claimed; /* fd holds the file's lock (zr_metrics_lock); f owns fd once open */
    int fd;
    char path[ZR_PATH_MAX];
} zr_metrics_file;

/*
 * Take path as this run's metrics file: its folder made, only a regular file or nothing there
 * (zr_file_output_kind), then the file opened (created when missing) and locked at once
 * (zr_file_lock: an flock, held until zr_metrics_close or the end of the process, whatever ends
 * it). Another running zr train holding it is refused (ZR_ERR_INVALID, naming the file), so two
 * runs started at the same moment never share one file; so is, for a fresh run, a file that
 * already holds lines (zr_metrics_check_fresh).
 */
zr_status zr_metrics_lock(zr_metrics_file *m, const char *path, int fresh);

/*
 * Start writing the file m holds. A resumed run first rewrites it atomically so that it ends at
 * last_step (zr_metrics_keep_through; the new file is locked before it replaces the old one).
 */
zr_status zr_metrics_start(zr_metrics_file *m, int resume, long long last_step, size_t *dropped);

/*
 * Is m's path still the file this run holds? ZR_ERR_IO naming it when it was deleted, moved or
 * replaced under the run. ZR_OK without a file.
 */
zr_status zr_metrics_check_held(const zr_metrics_file *m);

/*
 * zr_metrics_lock, then zr_metrics_start: open path for a run, creating its folder (mkdir(2), no
 * shell). Only a
 * regular file or nothing may stand at path (never a link, a device, a FIFO,
 * a folder: zr_file_output_kind). A fresh run starts the file, and refuses
 * one that already holds lines (another run's history). A resumed run first
 * rewrites the file atomically (zr_metrics_keep_through) so that it ends at
 * last_step, the step of the checkpoint it resumes from, then appends: every
 * step appears once, with the values of the run that produced the checkpoint
 * and then of the resumed run. *dropped counts the lines removed. ZR_ERR_IO
 * or ZR_ERR_INVALID naming the path on failure.
 */
zr_status zr_metrics_open(zr_metrics_file *m, const char *path, int resume, long long last_step,
                          size_t *dropped);

/* A fresh run's metrics file must be new or empty: ZR_ERR_INVALID naming it otherwise. */
zr_status zr_metrics_check_fresh(const char *path);

/* Append one line (from zr_metrics_line_end) and flush; a short write (full disk) is ZR_ERR_IO. */
zr_status zr_metrics_append(zr_metrics_file *m, const char *line);

/* Close; a write error that only the close sees is ZR_ERR_IO. Safe on a closed file. */
zr_status zr_metrics_close(zr_metrics_file *m);

/*
 * Rewrite the metrics file at path atomically keeping only the complete lines
 * whose "step" is at most last_step, in their order; *dropped counts the
 * others (later steps, a cut-off last line, lines that are not zr's). A
 * missing file is fine (nothing to keep).
 */
zr_status zr_metrics_keep_through(const char *path, long long last_step, size_t *dropped);

/*
 * Whether "zr train" draws its live progress bar (a line redrawn with \r
 * between the periodic progress lines, which are printed either way), from
 * the environment envp ("NAME=value" strings, NULL-terminated; pass environ)
 * read before MPI_Init, and whether stdout is a terminal. ZR_PROGRESS=1 (any
 * non-empty value but 0) forces it on, ZR_PROGRESS=0 off. Otherwise it is off
 * under a launcher (Open MPI: OMPI_COMM_WORLD_SIZE/RANK, PMIx: PMIX_RANK,
 * MPICH/Hydra: PMI_RANK/PMI_SIZE, Slurm: SLURM_PROCID/SLURM_JOB_ID), since
 * a rank cannot tell whether its output ends in a log; off under CI (CI set)
 * or TERM unset or dumb; on for a terminal.
 */
int zr_progress_bar_wanted(char *const *envp, int stdout_is_tty);

#endif /* ZR_METRICS_H */
