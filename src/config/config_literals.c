/*
 * config_literals.c - the text of a JSON configuration, read beside the
 * tree cJSON builds from it, for what that tree loses (config_impl.h):
 *
 *   - a number is kept as a double, so 9007199254740993 reads as ...992 and
 *     1e999 as an infinity that prints back as null; the text of each number
 *     at an integer key is recorded here, to be read exactly;
 *   - a string is cut at its first NUL, so "\u0000" would shorten a path
 *     silently; it is refused here.
 *
 * Each finding names the key and the line:column. The walk keeps the path
 * as a stack of keys and skips the inside of strings.
 */
#define _POSIX_C_SOURCE 200809L

#include "config_impl.h"

#include <stdio.h>
#include <string.h>

enum { DEPTH = 32, KEYLEN = 96 };

typedef struct walker {
    char keys[DEPTH][KEYLEN];
    int depth;
} walker;

/* The dotted path of the keys open at the walker's depth. */
static void path_of(const walker *w, char *path, size_t n)
{
    size_t used = 0;
    path[0] = '\0';
    for (int d = 0; d < w->depth && d < DEPTH; d++) {
        if (w->keys[d][0] != '\0') {
            int k = snprintf(path + used, n - used, "%s%s", used != 0 ? "." : "", w->keys[d]);
            used += k > 0 ? (size_t)k : 0;
            if (used >= n) {
                return;
            }
        }
    }
}

static zr_status record(cfg_literals *l, const cfg_key *k, const char *s, size_t len, int line,
                        int col)
{
    if (l->n == l->cap) {
        int cap = l->cap > 0 ? 2 * l->cap : 16;
        cfg_literal *v;
        ZR_ALLOC(v, (size_t)cap);
        if (l->n > 0) {
            memcpy(v, l->v, sizeof *v * (size_t)l->n);
        }
        zr_free(l->v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (cfg_literal){k, s, len, line, col};
    return ZR_OK;
}

/* A number at the walker's place: refused when no double holds it, recorded at an integer key. */
static zr_status number(const walker *w, const char *name, const char *s, size_t len, int line,
                        int col, cfg_literals *out)
{
    char path[DEPTH * KEYLEN];
    path_of(w, path, sizeof path);
    const cfg_key *k = zr_config_resolve(zr_config_find_key(path));
    if (zr_config_number_overflows(s, len)) {
        char shown[80], expect[200] = "";
        if (k != NULL) {
            zr_config_describe_expect(k, expect, sizeof expect);
        }
        zr_config_show_number(s, len, shown, sizeof shown);
        ZR_FAIL(ZR_ERR_INVALID, "%s:%d:%d: \"%s\": %s is out of range%s%s", name, line, col, path,
                shown, expect[0] ? ": it must be " : "", expect);
    }
    if (k != NULL && zr_config_is_int(k)) {
        ZR_CHECK(record(out, k, s, len, line, col));
    }
    return ZR_OK;
}

/* The string starting after the quote at *pp: its end (the closing quote or the NUL). */
static zr_status string(const walker *w, const char *name, int strict, const char **pp, int line,
                        const char *bol)
{
    const char *p = *pp;
    while (*p != '\0' && *p != '"') {
        if (*p == '\\' && strict && strncmp(p + 1, "u0000", 5) == 0) {
            char path[DEPTH * KEYLEN];
            path_of(w, path, sizeof path);
            ZR_FAIL(ZR_ERR_INVALID,
                    "%s:%d:%d: \"%s\": a string holds \\u0000 (a NUL character), which would cut "
                    "it short; remove it",
                    name, line, (int)(p - bol) + 1, path[0] != '\0' ? path : "(a key)");
        }
        p += *p == '\\' && p[1] != '\0' ? 2 : 1;
    }
    *pp = p;
    return ZR_OK;
}

zr_status zr_config_scan_literals(const char *text, const char *name, int strict, cfg_literals *out)
{
    memset(out, 0, sizeof *out);
    walker w;
    w.depth = 0;
    int line = 1;
    const char *bol = text, *str = NULL;
    size_t slen = 0;
    zr_status st = ZR_OK;
    for (const char *p = text; *p != '\0' && st == ZR_OK; p++) {
        char ch = *p;
        if (ch == '\n') {
            line++;
            bol = p + 1;
        } else if (ch == '"') {
            str = ++p;
            st = string(&w, name, strict, &p, line, bol);
            slen = (size_t)(p - str);
            if (*p == '\0') {
                break;
            }
        } else if (ch == '{' || ch == '[') {
            if (w.depth < DEPTH) {
                w.keys[w.depth][0] = '\0';
            }
            w.depth++;
        } else if (ch == '}' || ch == ']') {
            w.depth -= w.depth > 0;
        } else if (ch == ':' && str != NULL && w.depth > 0 && w.depth <= DEPTH) {
            snprintf(w.keys[w.depth - 1], KEYLEN, "%.*s", (int)(slen < KEYLEN ? slen : KEYLEN - 1),
                     str);
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            const char *start = p;
            while (p[1] != '\0' && strchr("0123456789+-.eE", p[1]) != NULL) {
                p++;
            }
            st =
                number(&w, name, start, (size_t)(p - start) + 1, line, (int)(start - bol) + 1, out);
        }
    }
    if (st != ZR_OK) {
        zr_config_literals_free(out);
    }
    return st;
}

void zr_config_literals_free(cfg_literals *l)
{
    zr_free(l->v);
    memset(l, 0, sizeof *l);
}

const cfg_literal *zr_config_find_literal(const cfg_literals *l, const cfg_key *k)
{
    for (int i = 0; l != NULL && i < l->n; i++) {
        if (l->v[i].key == k) {
            return &l->v[i];
        }
    }
    return NULL;
}
