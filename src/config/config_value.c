/*
 * config_value.c - one key's value: what it accepts (for messages and
 * checks), setting it from a JSON value, and printing it. A file and a flag
 * both end in zr_config_apply_value, so they accept and refuse the same values
 * with the same messages.
 */
#define _POSIX_C_SOURCE 200809L

#include "config_impl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void zr_config_emit(warn_fn warn, void *ctx, const char *msg)
{
    char safe[1024]; /* a key from the file is never printed raw */
    zr_str_printable(safe, sizeof safe, msg, strlen(msg));
    if (warn != NULL) {
        warn(ctx, safe);
    } else {
        fprintf(stderr, "zr: %s\n", safe);
    }
}

/* Is the choice list "a|b|c" holding s? Returns the canonical spelling or NULL. */
const char *zr_config_match_choice(const char *choices, const char *s, char *buf, size_t n)
{
    const char *p = choices;
    for (;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar == NULL ? strlen(p) : (size_t)(bar - p);
        if (len == strlen(s) && strncasecmp(p, s, len) == 0 && len < n) {
            memcpy(buf, p, len);
            buf[len] = '\0';
            return buf;
        }
        if (bar == NULL) {
            return NULL;
        }
        p = bar + 1;
    }
}

/* "\"a\", \"b\" or \"\"" (enum) / "4, 8" (int) for messages. */
static void describe_choices(const char *choices, int quoted, char *buf, size_t n)
{
    size_t used = 0;
    int count = 1;
    for (const char *q = choices; *q != '\0'; q++) {
        count += *q == '|';
    }
    const char *p = choices;
    for (int i = 0; i < count && used < n; i++) {
        const char *bar = strchr(p, '|');
        int len = bar == NULL ? (int)strlen(p) : (int)(bar - p);
        const char *sep = i == 0 ? "" : i == count - 1 ? " or " : ", ";
        int w = quoted ? snprintf(buf + used, n - used, "%s\"%.*s\"", sep, len, p)
                       : snprintf(buf + used, n - used, "%s%.*s", sep, len, p);
        used += w > 0 ? (size_t)w : 0;
        p = bar == NULL ? p + len : bar + 1;
    }
}

int zr_config_is_int(const cfg_key *k)
{
    return k->type == K_INT || k->type == K_I64 || k->type == K_U64;
}

/* The largest value of integer key k, exactly (the table holds doubles). */
static unsigned long long int_hi(const cfg_key *k)
{
    return k->hi >= 18446744073709551615.0 ? ULLONG_MAX : (unsigned long long)k->hi;
}

static void fmt_bound(const cfg_key *k, char *buf, size_t n, double v, int is_hi)
{
    if (zr_config_is_int(k)) {
        /* integers exactly: "2147483647", "18446744073709551615", never "2.147483647e+09" */
        snprintf(buf, n, "%llu", is_hi ? int_hi(k) : (unsigned long long)v);
    } else {
        snprintf(buf, n, "%.10g", v);
    }
}

/* What a key accepts, as a phrase: "an integer in [0, 3]", "true or false", ... */
void zr_config_describe_expect(const cfg_key *k, char *buf, size_t n)
{
    char lo[32], hi[32], range[80] = "";
    fmt_bound(k, lo, sizeof lo, k->lo, 0);
    fmt_bound(k, hi, sizeof hi, k->hi, 1);
    /* every integer key states both ends: "an integer >= 1" hid that 2^31 is too much */
    int unbounded = isinf(k->hi);
    if (unbounded) {
        snprintf(range, sizeof range, " %s %s", (k->open & LO_OPEN) ? ">" : ">=", lo);
    } else {
        snprintf(range, sizeof range, " in %c%s, %s%c", (k->open & LO_OPEN) ? '(' : '[', lo, hi,
                 (k->open & HI_OPEN) ? ')' : ']');
    }
    char ch[160];
    switch (k->type) {
    case K_INT:
    case K_I64:
    case K_U64:
        if (k->choices != NULL) {
            describe_choices(k->choices, 0, ch, sizeof ch);
            snprintf(buf, n, "one of %s", ch);
        } else if (k->multiple > 1) {
            snprintf(buf, n, "a multiple of %d%s", k->multiple, range);
        } else {
            snprintf(buf, n, "an integer%s", range);
        }
        break;
    case K_DBL:
        snprintf(buf, n, "a number%s", range);
        break;
    case K_BOOL:
        snprintf(buf, n, "true or false");
        break;
    case K_STR:
        snprintf(buf, n, "a string of at most %zu characters", k->size - 1);
        break;
    case K_ENUM:
        describe_choices(k->choices, 1, ch, sizeof ch);
        snprintf(buf, n, "one of %s", ch);
        break;
    case K_PAIR:
        snprintf(buf, n, "an array of 2 numbers%s", range);
        break;
    case K_NOEFFECT:
    case K_ALIAS:
        snprintf(buf, n, "anything");
        break;
    }
}

/* Is v acceptable for numeric key k (integrality, range, choices, multiple)? */
int zr_config_num_ok(const cfg_key *k, double v)
{
    if (!isfinite(v)) {
        return 0;
    }
    int integer = k->type == K_INT || k->type == K_I64 || k->type == K_U64;
    if (integer && v != floor(v)) {
        return 0;
    }
    if (integer && k->choices != NULL) {
        char buf[32];
        snprintf(buf, sizeof buf, "%.0f", v);
        return zr_config_match_choice(k->choices, buf, buf, sizeof buf) != NULL;
    }
    if (v < k->lo || v > k->hi || ((k->open & LO_OPEN) && v == k->lo) ||
        ((k->open & HI_OPEN) && v == k->hi)) {
        return 0;
    }
    if (integer && k->multiple > 1 && fmod(v, k->multiple) != 0) {
        return 0;
    }
    return 1;
}

/* A JSON value in a message: compact, cut at 48 characters. */
void zr_config_render_json(const cJSON *v, char *buf, size_t n)
{
    char *s = cJSON_PrintUnformatted(v);
    if (s == NULL) {
        snprintf(buf, n, "(unprintable)");
        return;
    }
    if (strlen(s) > 48) {
        snprintf(buf, n, "%.45s...", s);
    } else {
        snprintf(buf, n, "%s", s);
    }
    cJSON_free(s);
}

/* ---- setting one key from a JSON value ---------------------------------- */

/* Check v against key k (expect and got phrase both for messages) and store it. */
static zr_status store_value(zr_train_config *c, const cfg_key *k, const cJSON *v,
                             const char *where, const char *expect, const char *got,
                             const char *lit, size_t lit_len)
{
    switch (k->type) {
    case K_INT:
    case K_I64:
    case K_U64:
        if (!cJSON_IsNumber(v)) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        return zr_config_store_int(c, k, where, lit, lit_len);
    case K_DBL:
        if (!cJSON_IsNumber(v) || !zr_config_num_ok(k, v->valuedouble)) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        *(double *)zr_config_field(c, k->off) = v->valuedouble;
        break;
    case K_BOOL: {
        if (!cJSON_IsBool(v)) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        int b = cJSON_IsTrue(v);
        if (k->refuse != NULL && strcmp(k->refuse, b ? "true" : "false") == 0) {
            ZR_FAIL(ZR_ERR_INVALID, "%s: %s is not supported: %s", where, k->refuse, k->why);
        }
        if (zr_config_has_field(k)) {
            *(int *)zr_config_field(c, k->off) = b;
        }
        break;
    }
    case K_STR:
        if (!cJSON_IsString(v) || strlen(v->valuestring) >= k->size) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        snprintf((char *)zr_config_field(c, k->off), k->size, "%s", v->valuestring);
        break;
    case K_ENUM: {
        char canon[64];
        if (cJSON_IsString(v) && k->refuse != NULL && strcasecmp(v->valuestring, k->refuse) == 0) {
            ZR_FAIL(ZR_ERR_INVALID, "%s: %s is not supported: %s", where, got, k->why);
        }
        if (!cJSON_IsString(v) ||
            zr_config_match_choice(k->choices, v->valuestring, canon, sizeof canon) == NULL) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        snprintf((char *)zr_config_field(c, k->off), k->size, "%s", canon);
        break;
    }
    case K_PAIR: {
        const cJSON *a = cJSON_GetArrayItem(v, 0), *b = cJSON_GetArrayItem(v, 1);
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsNumber(a) ||
            !cJSON_IsNumber(b) || !zr_config_num_ok(k, a->valuedouble) ||
            !zr_config_num_ok(k, b->valuedouble)) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        *(double *)zr_config_field(c, k->off) = a->valuedouble;
        *(double *)zr_config_field(c, k->off2) = b->valuedouble;
        break;
    }
    case K_NOEFFECT:
    case K_ALIAS:
        break;
    }
    return ZR_OK;
}

/*
 * where names the key for messages: `config.json: "zero_optimization.stage"`
 * or `flag --stage (zero_optimization.stage)`. null is refused: DeepSpeed
 * reads it as "the default", which hides a value that was meant and lost.
 */
zr_status zr_config_apply_value(zr_train_config *c, const cfg_key *k, const cJSON *v,
                                const char *where, const char *lit, size_t lit_len, warn_fn warn,
                                void *ctx)
{
    char got[64], expect[200];
    if (k->type == K_NOEFFECT) {
        char msg[512];
        snprintf(msg, sizeof msg, "note: %s accepted, has no effect in zr: %s", where, k->why);
        zr_config_emit(warn, ctx, msg);
        return ZR_OK;
    }
    zr_config_describe_expect(k, expect, sizeof expect);
    if (cJSON_IsNull(v)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s is null; it must be %s (leave the key out for its default)",
                where, expect);
    }
    char num[40];
    if (zr_config_is_int(k) && cJSON_IsNumber(v) && lit == NULL) {
        /* no text: the double, which is exact up to 2^53 (beyond, zr_config_int_parse refuses) */
        snprintf(num, sizeof num, "%.17g", v->valuedouble);
        lit = num;
        lit_len = strlen(num);
    }
    if (lit != NULL) {
        zr_config_show_number(lit, lit_len, got, sizeof got);
    } else {
        zr_config_render_json(v, got, sizeof got);
    }
    ZR_CHECK(store_value(c, k, v, where, expect, got, lit, lit_len));
    c->given |= k->given;
    return ZR_OK;
}

int zr_config_int_parse(const char *s, size_t len, cfg_int *out)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf) {
        /* no 64-bit integer needs 64 characters: a number this long is beyond them */
        if (len > 0 && (s[0] == '-' || (s[0] >= '0' && s[0] <= '9'))) {
            return -1;
        }
        return 0;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    const char *p = buf + (buf[0] == '-');
    int digits = *p != '\0' && strspn(p, "0123456789") == strlen(p);
    out->neg = buf[0] == '-';
    if (digits) {
        char *end = NULL;
        errno = 0;
        out->mag = strtoull(p, &end, 10);
        return errno == ERANGE ? -1 : 1;
    }
    char *end = NULL;
    errno = 0;
    double d = strtod(buf, &end);
    if (end == buf || *end != '\0') {
        return 0;
    }
    if (errno != 0 || !isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0) {
        return -1;
    }
    out->neg = d < 0;
    out->mag = (unsigned long long)fabs(d);
    return 1;
}

zr_status zr_config_store_int(zr_train_config *c, const cfg_key *k, const char *where,
                              const char *s, size_t len)
{
    char got[80], expect[200];
    zr_config_show_number(s, len, got, sizeof got);
    zr_config_describe_expect(k, expect, sizeof expect);
    cfg_int v;
    int r = zr_config_int_parse(s, len, &v);
    if (r == 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
    }
    if (r < 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s, which is not exactly such an integer",
                where, expect, got);
    }
    /* every integer key starts at 0 or above */
    int ok = !(v.neg && v.mag > 0) && v.mag >= (unsigned long long)k->lo && v.mag <= int_hi(k) &&
             (k->type != K_INT || v.mag <= INT_MAX) && (k->type != K_I64 || v.mag <= LLONG_MAX) &&
             ((k->choices == NULL && k->multiple <= 1) || zr_config_num_ok(k, (double)v.mag));
    if (!ok) {
        ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
    }
    void *f = zr_config_field(c, k->off);
    if (k->type == K_INT) {
        *(int *)f = (int)v.mag;
    } else if (k->type == K_I64) {
        *(long long *)f = (long long)v.mag;
    } else {
        *(unsigned long long *)f = v.mag;
    }
    return ZR_OK;
}

/*
 * Does the number written as s[0..len) lie beyond what a double holds, so
 * that reading it gives an infinity (1e999, a 5000-digit integer) or zero
 * (1e-999)? Such a value would reach the checks as inf or 0 and be reported
 * as something the user never wrote; it is reported as written instead.
 */
int zr_config_number_overflows(const char *s, size_t len)
{
    /* s goes on past len ('\0'-terminated), so strtod reads it in place: the
       literal is a whole number only when strtod stops exactly at its end */
    char *end = NULL;
    errno = 0;
    double d = strtod(s, &end);
    return end == s + len && len > 0 && errno == ERANGE && (isinf(d) || d == 0.0);
}

/* A number's text for a message: as written, or its start and length when it is long. */
void zr_config_show_number(const char *s, size_t len, char *buf, size_t n)
{
    if (len <= 40) {
        snprintf(buf, n, "%.*s", (int)len, s);
    } else {
        snprintf(buf, n, "%.24s... (%zu characters)", s, len);
    }
}

/* The numeric value of a field, as a double (for range checks and printing). */
double zr_config_get_num(const zr_train_config *c, const cfg_key *k, size_t off)
{
    const void *p = zr_config_cfield(c, off);
    switch (k->type) {
    case K_INT:
    case K_BOOL:
        return *(const int *)p;
    case K_I64:
        return (double)*(const long long *)p;
    case K_U64:
        return (double)*(const unsigned long long *)p;
    default:
        return *(const double *)p;
    }
}

/* A field's value as text: 3, 0.001, true, "AdamW", [0.9, 0.95]. */
void zr_config_fmt_value(const zr_train_config *c, const cfg_key *k, char *buf, size_t n)
{
    const void *p = zr_config_cfield(c, k->off);
    switch (k->type) {
    case K_INT:
        snprintf(buf, n, "%d", *(const int *)p);
        break;
    case K_I64:
        snprintf(buf, n, "%lld", *(const long long *)p);
        break;
    case K_U64:
        snprintf(buf, n, "%llu", *(const unsigned long long *)p);
        break;
    case K_DBL:
        snprintf(buf, n, "%.10g", *(const double *)p);
        break;
    case K_BOOL:
        snprintf(buf, n, "%s", *(const int *)p ? "true" : "false");
        break;
    case K_STR:
    case K_ENUM:
        snprintf(buf, n, "\"%s\"", (const char *)p);
        break;
    case K_PAIR:
        snprintf(buf, n, "[%.10g, %.10g]", *(const double *)p,
                 *(const double *)zr_config_cfield(c, k->off2));
        break;
    case K_NOEFFECT:
    case K_ALIAS:
        snprintf(buf, n, "-");
        break;
    }
}
