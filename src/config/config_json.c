/*
 * config_json.c - reading a DeepSpeed-style JSON configuration file. Each
 * key found is set through the key table (config_value.c), integers from
 * their text as written (config_literals.c). An unknown key inside a section
 * zr knows is refused with a did-you-mean, as DeepSpeed refuses it; an
 * unknown top-level key (a DeepSpeed feature zr does not have) is a warning,
 * the first few by name. A key given twice (or by two names) and null are
 * refused. A configuration zr saved in a checkpoint is read leniently (what
 * an older or newer zr wrote must not stop a resume): zr_config_parse_saved.
 *
 * cJSON reports no line numbers; the error offset it returns is turned into
 * line:column here.
 */
#define _POSIX_C_SOURCE 200809L

#include "config_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "zr/file.h"

/* ---- the JSON walk ------------------------------------------------------ */

static const char *json_kind(const cJSON *v)
{
    if (cJSON_IsArray(v)) {
        return "an array";
    }
    if (cJSON_IsString(v)) {
        return "a string";
    }
    if (cJSON_IsNumber(v)) {
        return "a number";
    }
    if (cJSON_IsBool(v)) {
        return "a boolean";
    }
    if (cJSON_IsNull(v)) {
        return "null";
    }
    return "an object";
}

/* How a walk reads: a user's file (strict) or a configuration zr saved (lenient). */
typedef struct walk_ctx {
    const char *name; /* the file, for messages */
    int strict;
    const cfg_literals *lits;
    warn_fn warn;
    void *warn_ctx;
    unsigned char *set;  /* per key of the table (resolved): set by this file already */
    const char **set_as; /* ... under this name */
    int unknown_top;     /* unknown top-level keys seen */
} walk_ctx;

enum { MAX_UNKNOWN_LISTED = 10 };

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key that appears twice in one object: "stage": 1, "stage": 2 would keep one silently. */
static zr_status no_duplicates(const cJSON *obj, const char *prefix, const char *name)
{
    int n = cJSON_GetArraySize(obj);
    if (n < 2) {
        return ZR_OK;
    }
    const char **names;
    ZR_ALLOC(names, (size_t)n);
    int k = 0;
    const cJSON *child;
    cJSON_ArrayForEach(child, obj)
    {
        names[k++] = child->string != NULL ? child->string : "";
    }
    qsort(names, (size_t)n, sizeof *names, cmp_name);
    zr_status st = ZR_OK;
    for (int i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_INVALID,
                         "%s: key \"%s%s%.200s\" appears twice; give each key once", name, prefix,
                         prefix[0] != '\0' ? "." : "", names[i]);
        }
    }
done:
    zr_free(names);
    return st;
}

/* An unknown key: inside a section zr knows, refused (as DeepSpeed does); on top, a warning. */
static zr_status unknown_key(walk_ctx *w, const char *prefix, const char *key, const char *path)
{
    if (!w->strict) {
        return ZR_OK;
    }
    char hint[160], msg[640];
    int top = prefix[0] == '\0';
    if (top && ++w->unknown_top > MAX_UNKNOWN_LISTED) {
        return ZR_OK; /* counted, summed up at the end */
    }
    zr_config_suggest_json(prefix, key, hint, sizeof hint);
    if (!top) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s: unknown key \"%.200s\" in section \"%s\"%s%s%s; zr train --help lists "
                "every key",
                w->name, path, prefix, hint[0] ? " (did you mean \"" : "", hint,
                hint[0] ? "\"?)" : "");
    }
    snprintf(msg, sizeof msg, "%s: unknown key \"%.200s\"%s%s%s (ignored)", w->name, path,
             hint[0] ? " (did you mean \"" : "", hint, hint[0] ? "\"?)" : "");
    zr_config_emit(w->warn, w->warn_ctx, msg);
    return ZR_OK;
}

/* Key k set by this file under path; the same key twice (a name and its alias) is refused. */
static zr_status mark_set(walk_ctx *w, const cfg_key *k, const char *path)
{
    size_t i = (size_t)(k - zr_config_keys);
    if (w->set[i] && w->strict) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: \"%s\" and \"%s\" set the same key; give it once", w->name,
                w->set_as[i], path);
    }
    w->set[i] = 1;
    w->set_as[i] = path; /* a table entry's path: static */
    return ZR_OK;
}

static zr_status walk(zr_train_config *c, const cJSON *obj, const char *prefix, walk_ctx *w);

/* One member of an object: a key, a section, or unknown. */
static zr_status member(zr_train_config *c, const cJSON *child, const char *prefix, walk_ctx *w)
{
    const char *key = child->string != NULL ? child->string : "";
    char path[256];
    int n = prefix[0] == '\0' ? snprintf(path, sizeof path, "%s", key)
                              : snprintf(path, sizeof path, "%s.%s", prefix, key);
    int fits = n > 0 && (size_t)n < sizeof path;
    const cfg_key *k = fits ? zr_config_find_key(path) : NULL;
    char where[320];
    snprintf(where, sizeof where, "%s: \"%.256s\"", w->name, fits ? path : key);
    if (k != NULL) {
        const cfg_key *r = zr_config_resolve(k);
        if (r->type != K_NOEFFECT) {
            ZR_CHECK(mark_set(w, r, k->path));
        }
        const cfg_literal *lit = cJSON_IsNumber(child) ? zr_config_find_literal(w->lits, r) : NULL;
        zr_status st = zr_config_apply_value(c, r, child, where, lit ? lit->text : NULL,
                                             lit ? lit->len : 0, w->warn, w->warn_ctx);
        if (st != ZR_OK && !w->strict) {
            /* a value this zr no longer takes: the current one stays, and the key counts as
               not recorded (zr_config_compare cannot compare it) */
            zr_error_clear();
            w->set[r - zr_config_keys] = 0;
            return ZR_OK;
        }
        return st;
    }
    if (fits && zr_config_is_section(path)) {
        if (!cJSON_IsObject(child)) {
            if (!w->strict) {
                return ZR_OK;
            }
            char got[64];
            zr_config_render_json(child, got, sizeof got);
            ZR_FAIL(ZR_ERR_INVALID, "%s must be an object (a section of keys), got %s %s", where,
                    json_kind(child), got);
        }
        return walk(c, child, path, w);
    }
    return unknown_key(w, prefix, key, fits ? path : key);
}

static zr_status walk(zr_train_config *c, const cJSON *obj, const char *prefix, walk_ctx *w)
{
    if (w->strict) {
        ZR_CHECK(no_duplicates(obj, prefix, w->name));
    }
    const cJSON *child;
    cJSON_ArrayForEach(child, obj)
    {
        ZR_CHECK(member(c, child, prefix, w));
    }
    return ZR_OK;
}

/* Parse text (cJSON) and report where it stopped when it is not JSON. */
static zr_status parse_text(const char *text, const char *name, cJSON **out)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    *out = root;
    if (root != NULL) {
        return ZR_OK;
    }
    /* cJSON gives only a pointer to where it stopped: count lines to it */
    const char *at = end != NULL ? end : cJSON_GetErrorPtr();
    if (at == NULL || at < text || at > text + strlen(text)) {
        at = text + strlen(text);
    }
    int line = 1;
    const char *bol = text;
    for (const char *p = text; p < at; p++) {
        if (*p == '\n') {
            line++;
            bol = p + 1;
        }
    }
    int col = (int)(at - bol) + 1;
    const char *rest = at;
    while (*rest == ' ' || *rest == '\t' || *rest == '\n' || *rest == '\r') {
        rest++;
    }
    if (*rest == '\0') {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s:%d:%d: malformed JSON: unexpected end of input (truncated file?)", name, line,
                col);
    }
    /* a little of the line on both sides: cJSON often stops just past the culprit */
    const char *from = at - bol > 12 ? at - 12 : bol;
    int len = 0;
    while (len < 32 && from[len] != '\0' && from[len] != '\n' && from[len] != '\r') {
        len++;
    }
    ZR_FAIL(ZR_ERR_FORMAT, "%s:%d:%d: malformed JSON near '%.*s'", name, line, col, len, from);
}

/*
 * Read text over c: strictly (a user's file) or leniently (a configuration zr
 * saved); present (NULL: not wanted) gets 1 per key of the table that text set.
 */
static zr_status parse_config(zr_train_config *c, const char *text, const char *name, int strict,
                              warn_fn warn, void *ctx, unsigned char *present)
{
    cJSON *root = NULL;
    ZR_CHECK(parse_text(text, name, &root));
    cfg_literals lits;
    memset(&lits, 0, sizeof lits);
    walk_ctx w = {name, strict, &lits, warn, ctx, NULL, NULL, 0};
    zr_status st = ZR_OK;
    if (!cJSON_IsObject(root)) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_INVALID, "%s: the top level must be a JSON object, got %s",
                     name, json_kind(root));
    }
    ZR_CHECK_GOTO(zr_config_scan_literals(text, name, strict, &lits), st, done);
    ZR_ALLOC_GOTO(w.set, zr_config_nkeys, st, done);
    ZR_ALLOC_GOTO(w.set_as, zr_config_nkeys, st, done);
    ZR_CHECK_GOTO(walk(c, root, "", &w), st, done);
    if (present != NULL) {
        memcpy(present, w.set, zr_config_nkeys);
    }
    if (w.unknown_top > MAX_UNKNOWN_LISTED) {
        char msg[320];
        snprintf(msg, sizeof msg, "%s: %d more unknown top-level keys (ignored, not listed)", name,
                 w.unknown_top - MAX_UNKNOWN_LISTED);
        zr_config_emit(warn, ctx, msg);
    }
done:
    zr_free(w.set);
    zr_free(w.set_as);
    zr_config_literals_free(&lits);
    cJSON_Delete(root);
    return st;
}

zr_status zr_config_parse_json(zr_train_config *c, const char *text, const char *name,
                               void (*warn)(void *ctx, const char *msg), void *ctx)
{
    return parse_config(c, text, name, 1, warn, ctx, NULL);
}

zr_status zr_config_parse_saved(zr_train_config *c, const char *text, const char *name,
                                unsigned char *present)
{
    return parse_config(c, text, name, 0, NULL, NULL, present);
}

zr_status zr_config_load_json(zr_train_config *c, const char *path,
                              void (*warn)(void *ctx, const char *msg), void *ctx)
{
    /* a FIFO or a device would block or never end: refused before it is opened */
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open config file \"%s\": %s", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode)) {
        ZR_FAIL(ZR_ERR_INVALID, "config file \"%s\" is not a regular file (%s); give a JSON file",
                path, S_ISDIR(sb.st_mode) ? "a directory" : "a FIFO, socket or device");
    }
    FILE *f = NULL;
    ZR_CHECK(zr_file_open_read(path, &f));
    enum { MAX_BYTES = 16 << 20 }; /* a config is a few KB; this only stops a wrong file */
    char *text = NULL;
    zr_status st = ZR_ALLOC_STATUS(text, MAX_BYTES + 1);
    if (st != ZR_OK) {
        fclose(f);
        return st;
    }
    size_t n = fread(text, 1, MAX_BYTES + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_IO, "cannot read config file \"%s\"", path);
    }
    if (n > MAX_BYTES) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                     "config file \"%s\" is larger than %d bytes; is it a config?", path,
                     MAX_BYTES);
    }
    if (memchr(text, '\0', n) != NULL) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                     "config file \"%s\" holds a NUL byte; is it a text file?", path);
    }
    text[n] = '\0';
    st = zr_config_parse_json(c, text, path, warn, ctx);
done:
    zr_free(text);
    return st;
}
