/*
 * metrics.c - reading and writing the JSON-lines metrics of "zr train".
 *
 * The reader is what "zr plot" stands on; it lives in the library (not in
 * src/cli) so that the tests can reach it. Errors name file:line, since a
 * metrics file is often hand-edited or cut short by a killed job.
 */
#define _DEFAULT_SOURCE /* flock, getline */

#include "zr/metrics.h"

#include "zr/file.h"

#include <cJSON.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

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
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s:%d: a metrics line must be a JSON object", file,
                     lineno);
    }
    step = cJSON_GetObjectItemCaseSensitive(obj, "step");
    if (!cJSON_IsNumber(step) || step->valuedouble != floor(step->valuedouble) ||
        step->valuedouble < 0 || step->valuedouble > 9.0e15) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s:%d: \"step\" must be a non-negative integer%s",
                     file, lineno, step == NULL ? " (missing)" : "");
    }
    out->step = (long long)step->valuedouble;
    out->event = cJSON_GetObjectItemCaseSensitive(obj, "event") != NULL;
    if (out->event) {
        goto done; /* a resume's record (what changed), not a point of a curve */
    }
    ZR_CHECK_GOTO(get_number(obj, "loss", file, lineno, &out->loss, &has_loss), st, done);
    ZR_CHECK_GOTO(get_number(obj, "tokens_per_s", file, lineno, &out->tokens_per_s, &has_tps), st,
                  done);
    ZR_CHECK_GOTO(get_number(obj, "val_loss", file, lineno, &out->val_loss, &has_val), st, done);
    ZR_CHECK_GOTO(get_number(obj, "lr", file, lineno, &out->lr, &has_lr), st, done);
    if (!has_val && (!has_loss || !has_tps)) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
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
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open metrics file \"%s\": %s", path, strerror(errno));
    }
    FILE *f = NULL; /* a FIFO or a device is refused before it is opened */
    ZR_CHECK(zr_file_open_read(path, &f));
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
            goto done;
        }
        if (!p.event) {
            ZR_CHECK_GOTO(push(out, &p), st, done);
        }
    }
    if (ferror(f)) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_IO, "cannot read metrics file \"%s\"", path);
    }
    if (out->count == 0) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "metrics file \"%s\" holds no metrics lines", path);
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

/* ---- writing ------------------------------------------------------------ */

void zr_metrics_line_begin(zr_metrics_line *l, long long step)
{
    l->len = 0;
    l->text[0] = '\0';
    zr_metrics_line_i64(l, "step", step);
}

/* Append printf text; a line longer than the buffer is a bug in the caller. */
static void line_put(zr_metrics_line *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void line_put(zr_metrics_line *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(l->text + l->len, sizeof l->text - l->len, fmt, ap);
    va_end(ap);
    ZR_ASSERT(w >= 0 && (size_t)w < sizeof l->text - l->len);
    l->len += (size_t)w;
}

static void line_key(zr_metrics_line *l, const char *key)
{
    line_put(l, "%s\"%s\": ", l->len == 0 ? "{" : ", ", key);
}

void zr_metrics_line_i64(zr_metrics_line *l, const char *key, long long v)
{
    line_key(l, key);
    line_put(l, "%lld", v);
}

/*
 * JSON has no NaN or Infinity, and a reader that meets "nan" rejects the
 * whole file, so a non-finite value is written as null (read back as NaN).
 * %.9g and %.17g are the shortest fixed widths that read back to the same
 * float and double.
 */
void zr_metrics_line_f32(zr_metrics_line *l, const char *key, float v)
{
    line_key(l, key);
    if (isfinite(v)) {
        line_put(l, "%.9g", (double)v);
    } else {
        line_put(l, "null");
    }
}

void zr_metrics_line_f64(zr_metrics_line *l, const char *key, double v)
{
    line_key(l, key);
    if (isfinite(v)) {
        line_put(l, "%.17g", v);
    } else {
        line_put(l, "null");
    }
}

const char *zr_metrics_line_end(zr_metrics_line *l)
{
    line_put(l, "}\n");
    return l->text;
}

zr_status zr_metrics_write(FILE *f, const zr_metrics_point *p)
{
    zr_metrics_line l;
    zr_metrics_line_begin(&l, p->step);
    zr_metrics_line_f64(&l, "loss", p->loss);
    zr_metrics_line_f64(&l, "tokens_per_s", p->tokens_per_s);
    if (!isnan(p->val_loss)) {
        zr_metrics_line_f64(&l, "val_loss", p->val_loss);
    }
    if (!isnan(p->lr)) {
        zr_metrics_line_f64(&l, "lr", p->lr);
    }
    zr_metrics_line_end(&l);
    if (fwrite(l.text, 1, l.len, f) != l.len || ferror(f)) {
        ZR_FAIL(ZR_ERR_IO, "cannot write a metrics line: %s", strerror(errno));
    }
    return ZR_OK;
}

/* The "step" of a complete metrics line, or -1 if the line is not one zr wrote. */
static long long line_step(const char *line)
{
    cJSON *obj = cJSON_Parse(line);
    long long step = -1;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(obj, "step");
    if (cJSON_IsObject(obj) && cJSON_IsNumber(s) && s->valuedouble >= 0 &&
        s->valuedouble <= 9.0e15 && s->valuedouble == floor(s->valuedouble)) {
        step = (long long)s->valuedouble;
    }
    cJSON_Delete(obj);
    return step;
}

/*
 * zr_metrics_keep_through; keep != NULL: *keep = the new file, open for writing and locked
 * before it replaces the old one (whose lock the caller holds until then), so that no other
 * run can take the file in between.
 */
static zr_status keep_through(const char *path, long long last_step, size_t *dropped, int *keep)
{
    *dropped = 0;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) {
        return ZR_OK; /* nothing written yet: the resumed run starts the file */
    }
    char *text = NULL;
    size_t n = 0;
    ZR_CHECK(zr_file_read_all(path, &text, &n));
    zr_file_tmp t;
    zr_status st = zr_file_tmp_open(&t, path);
    if (st != ZR_OK) {
        zr_free(text);
        return st;
    }
    if (keep != NULL) {
        *keep = fcntl(fileno(t.f), F_DUPFD_CLOEXEC, 0);
        if (*keep < 0 || (flock(*keep, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)) {
            st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot lock %s: %s", t.tmp,
                             strerror(errno));
        }
    }
    /* complete lines only: a cut-off last line is what a killed run leaves */
    char *line = text;
    for (char *nl; st == ZR_OK && (nl = memchr(line, '\n', n - (size_t)(line - text))) != NULL;
         line = nl + 1) {
        *nl = '\0';
        long long s = line_step(line);
        if (s >= 0 && s <= last_step) {
            *nl = '\n';
            st = zr_file_tmp_write(&t, line, (size_t)(nl - line) + 1);
        } else if (!blank(line)) {
            (*dropped)++;
        }
    }
    if (line < text + n && !blank(line)) {
        (*dropped)++;
    }
    zr_free(text);
    st = zr_file_tmp_commit(&t, st);
    if (st != ZR_OK && keep != NULL && *keep >= 0) {
        close(*keep);
        *keep = -1;
    }
    return st;
}

zr_status zr_metrics_keep_through(const char *path, long long last_step, size_t *dropped)
{
    return keep_through(path, last_step, dropped, NULL);
}

zr_status zr_metrics_check_fresh(const char *path)
{
    char shown[160];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "metrics file %s already holds %lld bytes, written by another run; a fresh run "
                "does not overwrite them: continue that run with --resume, remove the file, or "
                "set zr.train.metrics_path (--metrics) to a new file",
                zr_file_show(path, shown, sizeof shown), (long long)sb.st_size);
    }
    return ZR_OK;
}

zr_status zr_metrics_lock(zr_metrics_file *m, const char *path, int fresh)
{
    char shown[160];
    memset(m, 0, sizeof *m);
    const char *p = zr_file_show(path, shown, sizeof shown);
    if (strlen(path) >= sizeof m->path) {
        ZR_FAIL(ZR_ERR_INVALID, "metrics path longer than %zu bytes: %s", sizeof m->path - 1, p);
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    /* the metrics file usually lives in the checkpoint folder, which may not exist yet */
    char dir[ZR_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL && slash != dir) {
        *slash = '\0';
        ZR_CHECK(zr_file_mkdir_p(dir));
    }
    /* a regular file or nothing: never a link, a device, a FIFO or a folder */
    int exists = 0, fd = -1, held = 0;
    ZR_CHECK(zr_file_output_kind(path, &exists));
    /* the lock is the open file's (flock): taken at once, atomically, held until the run ends
       however it ends; two runs started together cannot both get it */
    ZR_CHECK(zr_file_lock(path, O_WRONLY | O_APPEND, &fd, &held));
    if (held == 0) {
        close(fd);
        ZR_FAIL(ZR_ERR_INVALID,
                "metrics file %s is in use by another zr train that is running now: two runs "
                "would interleave their lines in one file. Wait for that run to end, or set "
                "zr.train.metrics_path (--metrics) to another file",
                p);
    }
    m->fd = fd;
    m->claimed = 1;
    /* a fresh run starts the curve; lines already there are another run's, and its history
       is not cut away without a word (checked under the lock: no run can start it meanwhile) */
    struct stat sb;
    if (fresh && fstat(fd, &sb) == 0 && sb.st_size > 0) {
        zr_status st = zr_metrics_check_fresh(path);
        (void)zr_metrics_close(m);
        return st;
    }
    return ZR_OK;
}

zr_status zr_metrics_start(zr_metrics_file *m, int resume, long long last_step, size_t *dropped)
{
    char shown[160];
    *dropped = 0;
    ZR_ASSERT(m->claimed && m->f == NULL);
    struct stat sb;
    if (resume && fstat(m->fd, &sb) == 0 && sb.st_size > 0) {
        /* a resumed run continues the curve, cut back to the step it resumes from */
        int fd = -1;
        ZR_CHECK(keep_through(m->path, last_step, dropped, &fd));
        if (fd >= 0) {
            close(m->fd); /* the old file, replaced: its lock goes with it */
            m->fd = fd;
        }
    }
    int flags = fcntl(m->fd, F_GETFL);
    if (flags >= 0) {
        (void)fcntl(m->fd, F_SETFL, flags | O_APPEND);
    }
    m->f = fdopen(m->fd, "a");
    if (m->f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "cannot open metrics file %s: %s",
                zr_file_show(m->path, shown, sizeof shown), strerror(errno));
    }
    return ZR_OK;
}

zr_status zr_metrics_open(zr_metrics_file *m, const char *path, int resume, long long last_step,
                          size_t *dropped)
{
    *dropped = 0;
    ZR_CHECK(zr_metrics_lock(m, path, !resume));
    zr_status st = zr_metrics_start(m, resume, last_step, dropped);
    if (st != ZR_OK) {
        (void)zr_metrics_close(m);
    }
    return st;
}

zr_status zr_metrics_check_held(const zr_metrics_file *m)
{
    int fd = m->f != NULL ? fileno(m->f) : m->claimed ? m->fd : -1;
    if (fd < 0) {
        return ZR_OK;
    }
    return zr_file_check_held(fd, m->path, "the metrics file",
                              "this run's lines would go to a file that no one reads (or mix "
                              "with another run's), so the run stops here");
}

zr_status zr_metrics_append(zr_metrics_file *m, const char *line)
{
    size_t n = strlen(line);
    /* flushed line by line so that zr plot can follow a running job */
    if (fwrite(line, 1, n, m->f) != n || fflush(m->f) != 0 || ferror(m->f)) {
        char shown[160];
        int err = errno;
        ZR_FAIL(ZR_ERR_IO,
                "cannot write metrics file %s: %s; the metrics of this run are "
                "incomplete",
                zr_file_show(m->path, shown, sizeof shown), strerror(err));
    }
    return ZR_OK;
}

zr_status zr_metrics_close(zr_metrics_file *m)
{
    if (m->f == NULL) {
        if (m->claimed) {
            close(m->fd); /* locked, never written: the lock ends */
        }
        m->claimed = 0;
        return ZR_OK;
    }
    m->claimed = 0;
    int bad = ferror(m->f) != 0;
    int err = errno;
    if (fclose(m->f) != 0) {
        bad = 1;
        err = errno;
    }
    m->f = NULL;
    if (bad) {
        ZR_FAIL(ZR_ERR_IO, "cannot write metrics file %s: %s", m->path, strerror(err));
    }
    return ZR_OK;
}

/* ---- the live progress bar ---------------------------------------------- */

/* The value of name in envp ("NAME=value" strings), or NULL. */
static const char *env_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (; envp != NULL && *envp != NULL; envp++) {
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=') {
            return *envp + n + 1;
        }
    }
    return NULL;
}

int zr_progress_bar_wanted(char *const *envp, int stdout_is_tty)
{
    const char *force = env_get(envp, "ZR_PROGRESS");
    if (force != NULL && force[0] != '\0') {
        return strcmp(force, "0") != 0;
    }
    /*
     * Under a launcher the rank's terminal says nothing about where the
     * output goes: Open MPI gives every rank a pseudo-terminal even when
     * mpirun's own output is a file, and a bar redrawn with \r fills such a
     * log with one line per step. Each launcher announces itself by these.
     */
    static const char *const launcher[] = {
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK", /* Open MPI's mpirun */
        "PMIX_RANK",            /* PMIx (Open MPI 5, prrte) */
        "PMI_RANK",
        "PMI_SIZE", /* MPICH / Hydra, Intel MPI */
        "SLURM_PROCID",
        "SLURM_JOB_ID", /* Slurm (srun, sbatch) */
    };
    for (size_t i = 0; i < sizeof launcher / sizeof launcher[0]; i++) {
        if (env_get(envp, launcher[i]) != NULL) {
            return 0;
        }
    }
    const char *term = env_get(envp, "TERM"), *ci = env_get(envp, "CI");
    if ((ci != NULL && ci[0] != '\0') || term == NULL || strcmp(term, "dumb") == 0) {
        return 0;
    }
    return stdout_is_tty != 0;
}
