/*
 * config_impl.h - what the files of the configuration of "zr train" share.
 *
 * One table of every key (config_keys.c) drives everything else, so that
 * the defaults, the JSON reader, the command-line flags, --help, the printout
 * and the JSON dump of the effective configuration cannot drift apart:
 *
 *   config_keys.c   the key table, lookups in it, defaults, did-you-mean
 *   config_value.c  one key's value: what it accepts, setting it from a JSON
 *                   value (files and flags both end there), printing it
 *   config_json.c   reading a DeepSpeed JSON file (zr_config_load_json)
 *   config_literals.c  the text of that file where cJSON's tree is not
 *                   enough: integers as written, \u0000, huge numbers
 *   config_diff.c   a configuration against the one a checkpoint saved
 *                   (zr_config_compare, for a resume)
 *   config_args.c   command-line flags (zr_config_from_args): --stage 3,
 *                   --zero_optimization.stage=3, --no-KEY, --config FILE
 *   config_print.c  --help, the printout and the JSON dump
 *   config_check.c  cross-field checks (zr_config_finalize), zr.model.init
 *   config_engine.c the engine settings the configuration asks for
 *                   (zr_config_engine), shared by the trainer and the planner
 *
 * Keys are DeepSpeed's where a DeepSpeed key means the same thing (a user's
 * ds_config.json should mostly just work), and zr's own under "zr". DeepSpeed
 * keys that make no sense for zr (CPU offload, bucket tuning of the PyTorch
 * implementation, ...) are accepted with a one-line note rather than flagged
 * as unknown, because the file is usually shared with a DeepSpeed run; keys
 * that would silently change the meaning of training (fp16, Adam without
 * decoupled weight decay) are refused. An unknown key inside a section zr
 * knows is refused with a did-you-mean, as DeepSpeed's own config models
 * refuse it (a typo there would train with the default); an unknown
 * top-level key is a warning (a section of a DeepSpeed feature zr does not
 * have), at most a few of them listed. Duplicate keys, null values and
 * \u0000 in strings are refused, and every integer is read exactly.
 *
 * Not a public header: nothing outside src/config includes it.
 */
#ifndef ZR_CONFIG_IMPL_H
#define ZR_CONFIG_IMPL_H

#include "zr/config.h"

#include <cJSON.h>

#include <limits.h>
#include <stddef.h>

typedef void (*warn_fn)(void *ctx, const char *msg);

typedef enum key_type {
    K_INT,      /* int */
    K_I64,      /* long long */
    K_U64,      /* unsigned long long (the seed; exact up to 2^53 through JSON) */
    K_DBL,      /* double */
    K_BOOL,     /* int 0/1, JSON true/false */
    K_STR,      /* char[size] */
    K_ENUM,     /* char[size], one of choices (matched case-insensitively, stored canonically) */
    K_PAIR,     /* two doubles, JSON [a, b] (betas) */
    K_NOEFFECT, /* a DeepSpeed key zr accepts and ignores (any value), with a note */
    K_ALIAS     /* a second JSON name of the key at target (DeepSpeed's non-stage3 names) */
} key_type;

/* Range flags: which bounds are open. */
#define LO_OPEN 1u
#define HI_OPEN 2u

#define NOFIELD ((size_t)-1)
#define IMAX    ((double)INT_MAX)

typedef struct cfg_key {
    const char *path; /* full dotted JSON path */
    key_type type;
    size_t off, off2;    /* offsets into zr_train_config (off2: second of a pair); NOFIELD = none */
    size_t size;         /* string buffer size */
    double def, def2;    /* numeric / bool / pair default */
    const char *sdef;    /* string default */
    double lo, hi;       /* numeric range */
    unsigned open;       /* LO_OPEN / HI_OPEN */
    int multiple;        /* integers: must be a multiple of this (0 = any) */
    const char *choices; /* enum: "a|b|c" ("" first = empty allowed); int: "4|8" */
    const char *flag;    /* short command-line alias without "--", or NULL */
    unsigned given;      /* ZR_GIVEN_* bit set when a file or flag sets the key */
    const char *refuse;  /* value refused with why ("true", "false", "fp16") */
    const char *why;     /* NOEFFECT: why it has no effect; refuse: why it is refused */
    const char *target;  /* ALIAS: path of the real key */
    const char *negate;  /* what --no-KEY sets (booleans: "false"), or NULL */
    zr_config_policy resume; /* what a resume may do with it (zr/config.h) */
    const char *help;
} cfg_key;

/* ---- config_keys.c: the table -------------------------------------------- */

extern const cfg_key zr_config_keys[];
extern const size_t zr_config_nkeys;

void *zr_config_field(zr_train_config *c, size_t off);
const void *zr_config_cfield(const zr_train_config *c, size_t off);
int zr_config_has_field(const cfg_key *k);
/* A key that sets a field (not a NOEFFECT or ALIAS entry): printed, dumped, checked. */
int zr_config_listed(const cfg_key *k);
const cfg_key *zr_config_find_key(const char *path);
const cfg_key *zr_config_find_flag(const char *flag);
/* An alias stands for its target everywhere except in messages. */
const cfg_key *zr_config_resolve(const cfg_key *k);
/* Is path a section (an object holding keys), e.g. "zero_optimization"? */
int zr_config_is_section(const char *path);
/* Length of the parent part of a dotted path ("a.b.c" -> 3, "a" -> 0). */
size_t zr_config_parent_len(const char *path);
const char *zr_config_leaf(const char *path);
/* Did-you-mean for an unknown JSON name under section parent ("" = top), or flag. */
void zr_config_suggest_json(const char *parent, const char *name, char *out, size_t n);
void zr_config_suggest_flag(const char *name, char *out, size_t n);

/* ---- config_literals.c: what cJSON does not keep -------------------------- */

/* The text of one number of a JSON file at an integer key, as written. */
typedef struct cfg_literal {
    const cfg_key *key; /* resolved */
    const char *text;   /* into the file's text, len characters */
    size_t len;
    int line, col;
} cfg_literal;

typedef struct cfg_literals {
    cfg_literal *v; /* counted allocation */
    int n, cap;
} cfg_literals;

/*
 * Read the text of a JSON file (which cJSON parsed) for what its tree loses:
 * each number at an integer key as written (cJSON keeps a double, which
 * rounds beyond 2^53), a number no double holds (1e999; refused, naming key
 * and line:column) and, when strict, a \u0000 in a string (refused: cJSON
 * would cut the string there).
 */
zr_status zr_config_scan_literals(const char *text, const char *name, int strict,
                                  cfg_literals *out);
void zr_config_literals_free(cfg_literals *l);
/* The literal of key k (resolved), or NULL. */
const cfg_literal *zr_config_find_literal(const cfg_literals *l, const cfg_key *k);

/* ---- config_json.c --------------------------------------------------------- */

/* Read a configuration zr saved (a manifest's "config") over c, leniently:
   unknown keys, nulls and values this zr does not take leave c as it was.
   present (NULL: not wanted; else zr_config_nkeys entries) gets 1 for each key
   of the table whose value text gave and this zr took, 0 for the others. */
zr_status zr_config_parse_saved(zr_train_config *c, const char *text, const char *name,
                                unsigned char *present);

/* ---- config_value.c: one key's value ------------------------------------- */

/* An integer exactly as written: sign and magnitude (every 64-bit value of either sign). */
typedef struct cfg_int {
    int neg;
    unsigned long long mag;
} cfg_int;

/*
 * Read the integer written as s[0..len): digits with an optional '-' read
 * exactly; a fraction or exponent only when the value is whole and at most
 * 2^53 (where a double is exact). 1: *out holds it; 0: not a number at all;
 * -1: a number, but not a whole one, or beyond 64 bits, or not exact.
 */
int zr_config_int_parse(const char *s, size_t len, cfg_int *out);
/* Set integer key k to v when its range (and choices, multiple) allow it; else refuse
   naming where, the range and the text as written. */
zr_status zr_config_store_int(zr_train_config *c, const cfg_key *k, const char *where,
                              const char *s, size_t len);

/* A warning or note to warn, or to stderr when warn is NULL. */
void zr_config_emit(warn_fn warn, void *ctx, const char *msg);
/* Is the choice list "a|b|c" holding s? Returns the canonical spelling or NULL. */
const char *zr_config_match_choice(const char *choices, const char *s, char *buf, size_t n);
/* What a key accepts, as a phrase: "an integer in [0, 3]", "true or false", ... */
void zr_config_describe_expect(const cfg_key *k, char *buf, size_t n);
/* Is v acceptable for numeric key k (integrality, range, choices, multiple)? */
int zr_config_num_ok(const cfg_key *k, double v);
/* A JSON value in a message: compact, cut at 48 characters. */
void zr_config_render_json(const cJSON *v, char *buf, size_t n);
/*
 * Set key k from JSON value v; where names the key for messages. lit: the
 * number as written, for an integer key (NULL: the text is v's double, exact
 * up to 2^53). null is refused (leave the key out for its default).
 */
zr_status zr_config_apply_value(zr_train_config *c, const cfg_key *k, const cJSON *v,
                                const char *where, const char *lit, size_t lit_len, warn_fn warn,
                                void *ctx);
/* Is k an integer key (int, long long, unsigned long long)? */
int zr_config_is_int(const cfg_key *k);
/* Does the number written as s[0..len) lie beyond a double? s is '\0'-terminated. */
int zr_config_number_overflows(const char *s, size_t len);
/* A number's text for a message: as written, or its start and length when it is long. */
void zr_config_show_number(const char *s, size_t len, char *buf, size_t n);
/* The numeric value of a field, as a double (for range checks and printing). */
double zr_config_get_num(const zr_train_config *c, const cfg_key *k, size_t off);
/* A field's value as text: 3, 0.001, true, "AdamW", [0.9, 0.95]. */
void zr_config_fmt_value(const zr_train_config *c, const cfg_key *k, char *buf, size_t n);

#endif /* ZR_CONFIG_IMPL_H */
