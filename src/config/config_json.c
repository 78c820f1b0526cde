/*
 * config_json.c - reading a DeepSpeed-style JSON configuration file. Each
 * key found is set through the key table (config_value.c); an unknown key is
 * a warning with a did-you-mean, since the file is often shared with a
 * DeepSpeed run.
 *
 * cJSON reports no line numbers; the error offset it returns is turned into
 * line:column here.
 */
#define _POSIX_C_SOURCE 200809L

#include "config_impl.h"

#include <errno.h>
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

static zr_status walk(zr_train_config *c, const cJSON *obj, const char *prefix, const char *name,
                      warn_fn warn, void *ctx)
{
    const cJSON *child;
    cJSON_ArrayForEach(child, obj)
    {
        const char *key = child->string != NULL ? child->string : "";
        char path[256];
        int w = prefix[0] == '\0' ? snprintf(path, sizeof path, "%s", key)
                                  : snprintf(path, sizeof path, "%s.%s", prefix, key);
        const cfg_key *k = w > 0 && (size_t)w < sizeof path ? zr_cfg_find_key(path) : NULL;
        char where[320];
        snprintf(where, sizeof where, "%s: \"%s\"", name, path);
        if (k != NULL) {
            ZR_CHECK(zr_cfg_apply_value(c, zr_cfg_resolve(k), child, where, warn, ctx));
        } else if (w > 0 && (size_t)w < sizeof path && zr_cfg_is_section(path)) {
            if (cJSON_IsNull(child)) {
                continue;
            }
            if (!cJSON_IsObject(child)) {
                char got[64];
                zr_cfg_render_json(child, got, sizeof got);
                ZR_FAIL(ZR_ERR_INVALID, "%s must be an object, got %s %s", where, json_kind(child),
                        got);
            }
            ZR_CHECK(walk(c, child, path, name, warn, ctx));
        } else {
            char hint[160], msg[640];
            zr_cfg_suggest_json(prefix, key, hint, sizeof hint);
            snprintf(msg, sizeof msg, "warning: %s: unknown key \"%.200s\"%s%s%s", name, path,
                     hint[0] ? " (did you mean \"" : "", hint, hint[0] ? "\"?)" : "");
            zr_cfg_emit(warn, ctx, msg);
        }
    }
    return ZR_OK;
}

/*
 * cJSON reads 1e999 as an infinity and prints it back as null, so a check of
 * the parsed value could only say "got null". This pass over the text of a
 * file that parsed finds each number whose value a double cannot hold and
 * reports it as written, with its key and line:column. Strings are skipped
 * (a number inside one is text); the path is kept as a stack of keys.
 */
static zr_status check_number_literals(const char *text, const char *name)
{
    enum { DEPTH = 32, KEYLEN = 96 };
    char keys_at[DEPTH][KEYLEN];
    int depth = 0, line = 1;
    const char *bol = text, *str = NULL;
    size_t slen = 0;
    for (const char *p = text; *p != '\0'; p++) {
        char ch = *p;
        if (ch == '\n') {
            line++;
            bol = p + 1;
        } else if (ch == '"') {
            str = ++p;
            while (*p != '\0' && *p != '"') {
                p += *p == '\\' && p[1] != '\0' ? 2 : 1;
            }
            slen = (size_t)(p - str);
            if (*p == '\0') {
                break;
            }
        } else if (ch == '{' || ch == '[') {
            if (depth < DEPTH) {
                keys_at[depth][0] = '\0';
            }
            depth++;
        } else if (ch == '}' || ch == ']') {
            depth -= depth > 0;
        } else if (ch == ':' && str != NULL && depth > 0 && depth <= DEPTH) {
            snprintf(keys_at[depth - 1], KEYLEN, "%.*s", (int)(slen < KEYLEN ? slen : KEYLEN - 1),
                     str);
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            const char *start = p;
            while (p[1] != '\0' && strchr("0123456789+-.eE", p[1]) != NULL) {
                p++;
            }
            size_t len = (size_t)(p - start) + 1;
            if (zr_cfg_number_overflows(start, len)) {
                char path[DEPTH * KEYLEN] = "", shown[80], expect[200] = "";
                size_t used = 0;
                for (int d = 0; d < depth && d < DEPTH; d++) {
                    if (keys_at[d][0] != '\0') {
                        int w = snprintf(path + used, sizeof path - used, "%s%s",
                                         used != 0 ? "." : "", keys_at[d]);
                        used += w > 0 ? (size_t)w : 0;
                    }
                }
                const cfg_key *k = zr_cfg_resolve(zr_cfg_find_key(path));
                if (k != NULL) {
                    zr_cfg_describe_expect(k, expect, sizeof expect);
                }
                zr_cfg_show_number(start, len, shown, sizeof shown);
                ZR_FAIL(ZR_ERR_INVALID, "%s:%d:%d: \"%s\": %s is out of range%s%s", name, line,
                        (int)(start - bol) + 1, path, shown, expect[0] ? ": it must be " : "",
                        expect);
            }
        }
    }
    return ZR_OK;
}

zr_status zr_config_parse_json(zr_train_config *c, const char *text, const char *name,
                               void (*warn)(void *ctx, const char *msg), void *ctx)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (root == NULL) {
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
                    "%s:%d:%d: malformed JSON: unexpected end of input (truncated file?)", name,
                    line, col);
        }
        /* a little of the line on both sides: cJSON often stops just past the culprit */
        const char *from = at - bol > 12 ? at - 12 : bol;
        int len = 0;
        while (len < 32 && from[len] != '\0' && from[len] != '\n' && from[len] != '\r') {
            len++;
        }
        ZR_FAIL(ZR_ERR_FORMAT, "%s:%d:%d: malformed JSON near '%.*s'", name, line, col, len, from);
    }
    zr_status st;
    if (!cJSON_IsObject(root)) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_INVALID, "%s: the top level must be a JSON object, got %s",
                     name, json_kind(root));
    }
    ZR_CHECK_GOTO(check_number_literals(text, name), st, done);
    ZR_CHECK_GOTO(walk(c, root, "", name, warn, ctx), st, done);
done:
    cJSON_Delete(root);
    return st;
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
    zr_status st = zr_alloc_at((void **)&text, MAX_BYTES + 1, __FILE__, __LINE__);
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
