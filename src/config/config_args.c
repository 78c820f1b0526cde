/*
 * config_args.c - the command-line flags of "zr train": --KEY VALUE and
 * --KEY=VALUE for every key of the table (dotted path or short alias),
 * --KEY / --no-KEY for booleans (and --no-hpz: hpZ off, its partition size
 * 1), and --config FILE (one). Integers are read from their text exactly. A flag's text is turned
 * into the JSON value a file would hold, so flags and files share one check.
 */
#define _POSIX_C_SOURCE 200809L

#include "config_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- command-line flags ------------------------------------------------- */

static int bool_word(const char *s, int *b)
{
    static const char *const yes[] = {"true", "1", "yes", "on"}, *const no[] = {"false", "0", "no",
                                                                                "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *b = 1;
            return 1;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *b = 0;
            return 1;
        }
    }
    return 0;
}

/* A list value: "0.9,0.95" or "[0.9, 0.95]"; anything else stays a string. */
static zr_status list_from_text(const cfg_key *k, const char *text, cJSON **out)
{
    size_t n = strlen(text) + 3;
    char *buf = NULL;
    ZR_ALLOC(buf, n);
    int bracket = text[0] == '[' || k->type == K_NOEFFECT;
    snprintf(buf, n, bracket ? "%s" : "[%s]", text);
    *out = cJSON_Parse(buf);
    zr_free(buf);
    if (*out == NULL) {
        *out = cJSON_CreateString(text);
    }
    return ZR_OK;
}

/*
 * Turn a flag's text into the JSON value a file would hold, so that flags
 * and files go through the same checks. Text that does not read as the
 * key's type becomes a JSON string, which then fails the type check with the
 * text quoted in the message.
 */
static zr_status value_from_text(const cfg_key *k, const char *text, const char *where, cJSON **out)
{
    cJSON *v = NULL;
    switch (k->type) {
    case K_INT:
    case K_I64:
    case K_U64:
    case K_DBL: {
        char *end = NULL;
        errno = 0;
        double d = strtod(text, &end);
        int number = end != text && *end == '\0' && errno == 0 && isfinite(d);
        v = number ? cJSON_CreateNumber(d) : cJSON_CreateString(text);
        break;
    }
    case K_BOOL: {
        int b;
        v = bool_word(text, &b) ? cJSON_CreateBool(b) : cJSON_CreateString(text);
        break;
    }
    case K_PAIR:
    case K_NOEFFECT:
        ZR_CHECK(list_from_text(k, text, &v));
        break;
    case K_STR:
    case K_ENUM:
    case K_ALIAS:
        v = cJSON_CreateString(text);
        break;
    }
    if (v == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "%s: out of memory", where);
    }
    *out = v;
    return ZR_OK;
}

static zr_status apply_text(zr_train_config *c, const cfg_key *k, const char *text,
                            const char *where, warn_fn warn, void *ctx)
{
    int numeric = k->type == K_INT || k->type == K_I64 || k->type == K_U64 || k->type == K_DBL;
    size_t len = strlen(text);
    if (numeric && zr_config_number_overflows(text, len)) {
        char shown[80], expect[200];
        zr_config_show_number(text, len, shown, sizeof shown);
        zr_config_describe_expect(k, expect, sizeof expect);
        ZR_FAIL(ZR_ERR_INVALID, "%s: %s is out of range: it must be %s", where, shown, expect);
    }
    cfg_int exact;
    if (zr_config_is_int(k) && zr_config_int_parse(text, len, &exact) != 0) {
        /* a number: read from its text, exactly (a double would round 2^53 + 1) */
        ZR_CHECK(zr_config_store_int(c, k, where, text, len));
        c->given |= k->given;
        return ZR_OK;
    }
    cJSON *v = NULL;
    ZR_CHECK(value_from_text(k, text, where, &v));
    zr_status st = zr_config_apply_value(c, k, v, where, NULL, 0, warn, ctx);
    cJSON_Delete(v);
    return st;
}

/* Is this argument -h / --help? */
static int is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/*
 * The key flag --name stands for: its dotted path, its short alias, or
 * --no-KEY of a boolean (then *negated). Booleans: --KEY (true), --KEY=WORD or
 * --KEY WORD (WORD one of true/false, 1/0, yes/no, on/off) and --no-KEY
 * (false), which takes no value: --no-KEY=true would read as a double
 * negative, so it is refused naming --no-KEY and the spelling to use. value
 * is the text after '=' (NULL without one), next the following argument
 * (NULL at the end).
 */
static zr_status flag_key(const char *name, const char *value, const char *next,
                          const cfg_key **out, int *negated)
{
    *negated = 0;
    const cfg_key *k = zr_config_find_key(name);
    if (k == NULL) {
        k = zr_config_find_flag(name);
    }
    if (k == NULL && strncmp(name, "no-", 3) == 0) {
        const cfg_key *nk = zr_config_find_key(name + 3);
        nk = zr_config_resolve(nk != NULL ? nk : zr_config_find_flag(name + 3));
        int b;
        if (nk != NULL && nk->type != K_BOOL && nk->negate == NULL) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "flag --%s: --no- applies to true/false keys and --no-hpz only, and %s "
                    "is not one; write --%s VALUE",
                    name, nk->path, name + 3);
        }
        const char *extra = value != NULL                         ? value
                            : next != NULL && bool_word(next, &b) ? next
                                                                  : NULL;
        if (nk != NULL && extra != NULL) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "flag --%s takes no value (got \"%.60s\"): write --%s "
                    "alone to set %s to false, or --%s=true / --%s=false",
                    name, extra, name, nk->path, name + 3, name + 3);
        }
        if (nk != NULL) {
            k = nk;
            *negated = 1;
        }
    }
    if (k == NULL) {
        char hint[160];
        zr_config_suggest_flag(name, hint, sizeof hint);
        ZR_FAIL(ZR_ERR_INVALID, "unknown flag --%s%s%s%s; see zr train --help", name,
                hint[0] ? " (did you mean " : "", hint, hint[0] ? "?)" : "");
    }
    *out = zr_config_resolve(k);
    return ZR_OK;
}

/*
 * The text of the flag at argv[*i] for key target: *value is what followed
 * '=' (NULL without one); without one the flag takes the next argument,
 * advancing *i, except a boolean, which takes it only if it is a boolean word.
 */
static zr_status flag_value(const cfg_key *target, int negated, const char *where, int argc,
                            char **argv, int *i, const char **value)
{
    if (negated) {
        *value = target->negate != NULL ? target->negate : "false";
    } else if (*value == NULL && target->type == K_BOOL) {
        /* a bare boolean is true; it takes the next argument only if that is a boolean word */
        int b;
        if (*i + 1 < argc && bool_word(argv[*i + 1], &b)) {
            *value = argv[++*i];
        } else {
            *value = "true";
        }
    } else if (*value == NULL) {
        if (*i + 1 >= argc) {
            ZR_FAIL(ZR_ERR_INVALID, "%s needs a value", where);
        }
        if (strncmp(argv[*i + 1], "--", 2) == 0) {
            ZR_FAIL(ZR_ERR_INVALID, "%s needs a value, got the flag %s", where, argv[*i + 1]);
        }
        *value = argv[++*i];
    }
    return ZR_OK;
}

/* "--name=value" or "--name": name copied out, value after '=' or NULL. */
static zr_status split_flag(const char *arg, char *name, size_t n, const char **value)
{
    /* argv holds only what follows the command name, so every word is a flag or its value:
       a stray word (zr train my.txt) is an error, never silently dropped */
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
        ZR_FAIL(ZR_ERR_INVALID,
                "unexpected argument \"%.200s\": zr train takes only flags (--key value or "
                "--key=value; a data file is --data FILE, a config file --config FILE.json; "
                "see --help)",
                arg);
    }
    const char *eq = strchr(arg + 2, '=');
    size_t nlen = eq != NULL ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    if (nlen >= n) {
        ZR_FAIL(ZR_ERR_INVALID, "unknown flag %.80s...", arg);
    }
    memcpy(name, arg + 2, nlen);
    name[nlen] = '\0';
    *value = eq != NULL ? eq + 1 : NULL;
    return ZR_OK;
}

/*
 * One pass over argv. Pass 0 reads only --config files, pass 1 applies every
 * other flag, so that a file never overrides a flag whatever their order.
 */
static zr_status args_pass(zr_train_config *c, int argc, char **argv, int pass, warn_fn warn,
                           void *ctx)
{
    for (int i = 0; i < argc; i++) {
        char name[256];
        const char *value = NULL;
        ZR_CHECK(split_flag(argv[i], name, sizeof name, &value));
        if (strcmp(name, "config") == 0) {
            if (value == NULL) {
                if (i + 1 >= argc) {
                    ZR_FAIL(ZR_ERR_INVALID, "flag --config needs a value (a JSON file)");
                }
                value = argv[++i];
            }
            if (pass == 0) {
                /* one file: a second would merge silently, key by key, into the first */
                if (c->config_path[0] != '\0') {
                    ZR_FAIL(ZR_ERR_INVALID,
                            "--config is given twice (%.200s and %.200s): give one configuration "
                            "file, and flags for what differs from it",
                            c->config_path, value);
                }
                if (strlen(value) >= sizeof c->config_path || value[0] == '\0') {
                    ZR_FAIL(ZR_ERR_INVALID,
                            "flag --config: the path is empty or longer than %zu "
                            "bytes",
                            sizeof c->config_path - 1);
                }
                ZR_CHECK(zr_config_load_json(c, value, warn, ctx));
                snprintf(c->config_path, sizeof c->config_path, "%s", value);
            }
            continue;
        }
        const cfg_key *target = NULL;
        int negated = 0;
        ZR_CHECK(flag_key(name, value, i + 1 < argc ? argv[i + 1] : NULL, &target, &negated));
        char where[320];
        if (strcmp(name, target->path) == 0) {
            snprintf(where, sizeof where, "flag --%s", name);
        } else {
            snprintf(where, sizeof where, "flag --%s (%s)", name, target->path);
        }
        ZR_CHECK(flag_value(target, negated, where, argc, argv, &i, &value));
        if (pass == 1) {
            ZR_CHECK(apply_text(c, target, value, where, warn, ctx));
        }
    }
    return ZR_OK;
}

zr_status zr_config_from_args(zr_train_config *c, int argc, char **argv, int *help,
                              void (*warn)(void *ctx, const char *msg), void *ctx)
{
    *help = 0;
    for (int i = 0; i < argc; i++) {
        if (is_help(argv[i])) {
            *help = 1;
            return ZR_OK;
        }
    }
    ZR_CHECK(args_pass(c, argc, argv, 0, warn, ctx));
    ZR_CHECK(args_pass(c, argc, argv, 1, warn, ctx));
    return ZR_OK;
}
