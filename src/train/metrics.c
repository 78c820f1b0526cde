/*
 * metrics.c - reading and writing the JSON-lines metrics of "zr train".
 *
 * The reader is what "zr plot" stands on; it lives in the library (not in
 * src/cli) so that the tests can reach it. Errors name file:line, since a
 * metrics file is often hand-edited or cut short by a killed job.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/metrics.h"

#include <cJSON.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A numeric field: absent or null -> NaN (and *present = 0); wrong type -> error. */
static zr_status get_number(const cJSON *obj, const char *key, const char *file, int lineno,
                            double *out, int *present)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NAN;
    *present = v != NULL;
    if (v == NULL || cJSON_IsNull(v)) {
        return ZR_OK;
    }
    if (!cJSON_IsNumber(v)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s:%d: \"%s\" must be a number", file, lineno, key);
    }
    *out = v->valuedouble;
    return ZR_OK;
}

zr_status zr_metrics_parse_line(const char *line, const char *file, int lineno,
                                zr_metrics_point *out)
{
    cJSON *obj = cJSON_Parse(line);
    if (obj == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s:%d: malformed JSON line: %.60s", file, lineno, line);
    }
    zr_status st = ZR_OK;
    int has_loss = 0, has_tps = 0, has_val = 0, has_lr = 0;
    const cJSON *step = NULL;
    if (!cJSON_IsObject(obj)) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__, "%s:%d: a metrics line must be a JSON object",
                         file, lineno);
        goto done;
    }
    step = cJSON_GetObjectItemCaseSensitive(obj, "step");
    if (!cJSON_IsNumber(step) || step->valuedouble != floor(step->valuedouble) ||
        step->valuedouble < 0 || step->valuedouble > 9.0e15) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s:%d: \"step\" must be a non-negative integer%s", file, lineno,
                         step == NULL ? " (missing)" : "");
        goto done;
    }
    out->step = (long long)step->valuedouble;
    ZR_CHECK_GOTO(get_number(obj, "loss", file, lineno, &out->loss, &has_loss), st, done);
    ZR_CHECK_GOTO(get_number(obj, "tokens_per_s", file, lineno, &out->tokens_per_s, &has_tps), st,
                  done);
    ZR_CHECK_GOTO(get_number(obj, "val_loss", file, lineno, &out->val_loss, &has_val), st, done);
    ZR_CHECK_GOTO(get_number(obj, "lr", file, lineno, &out->lr, &has_lr), st, done);
    if (!has_val && (!has_loss || !has_tps)) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s:%d: a training line needs \"loss\" and \"tokens_per_s\" (missing %s)",
                         file, lineno, !has_loss ? "\"loss\"" : "\"tokens_per_s\"");
    }
done:
    cJSON_Delete(obj);
    return st;
}

void zr_metrics_label(const char *path, char *buf, size_t n)
{
    /* the last folder name; a bare file name (or ./x) gives its stem instead */
    const char *slash = strrchr(path, '/');
    const char *start = path, *end = path;
    if (slash != NULL) {
        end = slash;
        while (end > path && end[-1] == '/') {
            end--;
        }
        start = end;
        while (start > path && start[-1] != '/') {
            start--;
        }
    }
    if (end - start == 0 || (end - start == 1 && *start == '.') ||
        (end - start == 2 && strncmp(start, "..", 2) == 0)) {
        start = slash != NULL ? slash + 1 : path;
        const char *dot = strrchr(start, '.');
        end = dot != NULL && dot != start ? dot : start + strlen(start);
    }
    snprintf(buf, n, "%.*s", (int)(end - start), start);
}

static zr_status push(zr_metrics_series *s, const zr_metrics_point *p)
{
    if (s->count == s->cap) {
        size_t cap = s->cap != 0 ? 2 * s->cap : 256;
        zr_metrics_point *next;
        ZR_ALLOC(next, cap);
        if (s->count != 0) {
            memcpy(next, s->points, s->count * sizeof *next);
        }
        zr_free(s->points);
        s->points = next;
        s->cap = cap;
    }
    s->points[s->count++] = *p;
    return ZR_OK;
}

static int blank(const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') {
            return 0;
        }
    }
    return 1;
}

zr_status zr_metrics_read(const char *path, zr_metrics_series *out)
{
    memset(out, 0, sizeof *out);
    zr_metrics_label(path, out->name, sizeof out->name);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "cannot open metrics file \"%s\": %s", path, strerror(errno));
    }
    char *line = NULL; /* getline's buffer (malloc), freed below */
    size_t cap = 0;
    ssize_t len;
    int lineno = 0;
    zr_status st = ZR_OK;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        int complete = len > 0 && line[len - 1] == '\n';
        if (complete) {
            line[len - 1] = '\0';
        }
        if (blank(line)) {
            continue;
        }
        zr_metrics_point p;
        st = zr_metrics_parse_line(line, path, lineno, &p);
        if (st != ZR_OK && !complete) {
            st = ZR_OK; /* a half-written last line of a running job */
            zr_error_clear();
            break;
        }
        if (st != ZR_OK) {
            break;
        }
        ZR_CHECK_GOTO(push(out, &p), st, done);
    }
    if (st == ZR_OK && ferror(f)) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot read metrics file \"%s\"", path);
    } else if (st == ZR_OK && out->count == 0) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "metrics file \"%s\" holds no metrics lines", path);
    }
done:
    free(line);
    fclose(f);
    return st;
}

void zr_metrics_free(zr_metrics_series *s)
{
    zr_free(s->points);
    memset(s, 0, sizeof *s);
}

static void put_number(FILE *f, const char *key, double v)
{
    if (isfinite(v)) {
        fprintf(f, ", \"%s\": %.9g", key, v);
    } else {
        fprintf(f, ", \"%s\": null", key);
    }
}

zr_status zr_metrics_write(FILE *f, const zr_metrics_point *p)
{
    fprintf(f, "{\"step\": %lld", p->step);
    put_number(f, "loss", p->loss);
    put_number(f, "tokens_per_s", p->tokens_per_s);
    if (!isnan(p->val_loss)) {
        put_number(f, "val_loss", p->val_loss);
    }
    if (!isnan(p->lr)) {
        put_number(f, "lr", p->lr);
    }
    fprintf(f, "}\n");
    if (ferror(f)) {
        ZR_FAIL(ZR_ERR_IO, "cannot write a metrics line: %s", strerror(errno));
    }
    return ZR_OK;
}
