/*
 * zr/metrics.h - the JSON-lines metrics file of "zr train" (one object per
 * line) and its reader, used by "zr plot".
 *
 * A line is an object with at least "step" and, for a training step, "loss"
 * and "tokens_per_s"; "val_loss" and "lr" are optional. A line holding
 * "val_loss" may leave out "loss" and "tokens_per_s" (a validation-only
 * line). Other fields are allowed and ignored, so the trainer may add more.
 * A number may be null where the trainer had no finite value; it reads as NaN.
 */
#ifndef ZR_METRICS_H
#define ZR_METRICS_H

#include "zr/base.h"

#include <stdio.h>

typedef struct zr_metrics_point {
    long long step;
    double loss;         /* NaN if absent or null */
    double tokens_per_s; /* NaN if absent or null */
    double val_loss;     /* NaN if absent or null */
    double lr;           /* NaN if absent or null */
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

/* Write one point as a line that zr_metrics_parse_line reads back (NaN as null). */
zr_status zr_metrics_write(FILE *f, const zr_metrics_point *p);

#endif /* ZR_METRICS_H */
