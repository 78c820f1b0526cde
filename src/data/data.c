/*
 * data.c - token shards, the byte tokenizer, datasets and the batch loader.
 *
 * Shard files follow llm.c (a 256 x int32 header with magic, version and the
 * token count, then uint16 GPT-2 or uint32 llama-3 tokens) so that data
 * prepared by llm.c's scripts trains here unchanged. What a file is comes
 * from its content, never from a guess that fails open: a file that carries
 * an llm.c magic is read as that file or refused, and a file is read as text
 * only if it is text, so a damaged shard or a foreign binary never trains as
 * 256-token "text". Files are validated completely before use: a wrong size
 * is reported, not read as garbage tokens.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/data.h"
#include "zr/file.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

/* ---- kinds ------------------------------------------------------------------ */

typedef struct shard_kind {
    zr_data_kind kind;
    int32_t magic, version;
    int token_bytes, vocab;
    const char *name;
} shard_kind;

static const shard_kind shard_kinds[] = {
    {ZR_DATA_GPT2, ZR_SHARD_MAGIC, ZR_SHARD_VERSION, 2, ZR_GPT2_VOCAB, "llm.c GPT-2 token shard"},
    {ZR_DATA_LLAMA3, ZR_SHARD_LLAMA3_MAGIC, ZR_SHARD_LLAMA3_VERSION, 4, ZR_LLAMA3_VOCAB,
     "llm.c llama-3 token shard"},
};

/* llm.c files that are not training tokens, refused by name rather than read as text. */
static const struct {
    int32_t magic;
    const char *what;
} other_llmc[] = {
    {20240326, "an llm.c GPT-2 model file; start training from it with zr.model.init (--init)"},
    {20240328, "an llm.c tokenizer file, not training tokens"},
    {20240522, "an llm.c evaluation file (HellaSwag/MMLU examples), not training tokens"},
};

static const shard_kind *kind_of(zr_data_kind kind)
{
    for (size_t i = 0; i < sizeof shard_kinds / sizeof shard_kinds[0]; i++) {
        if (shard_kinds[i].kind == kind) {
            return &shard_kinds[i];
        }
    }
    return NULL;
}

const char *zr_data_kind_name(zr_data_kind kind)
{
    const shard_kind *k = kind_of(kind);
    return k != NULL ? k->name : "text";
}

static int kind_vocab(zr_data_kind kind)
{
    const shard_kind *k = kind_of(kind);
    return k != NULL ? k->vocab : ZR_BYTE_VOCAB;
}

/* ---- shards ----------------------------------------------------------------- */

zr_status zr_shard_write_kind(const char *path, zr_data_kind kind, const void *tokens, size_t n)
{
    const shard_kind *k = kind_of(kind);
    if (k == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: a token shard is GPT-2 or llama-3, not %s", path,
                zr_data_kind_name(kind));
    }
    if (n > INT32_MAX) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: %zu tokens do not fit the shard header's int32 count", path,
                n);
    }
    int32_t header[ZR_SHARD_HEADER_INTS] = {0};
    header[0] = k->magic;
    header[1] = k->version;
    header[2] = (int32_t)n;
    zr_file_tmp t;
    ZR_CHECK(zr_file_tmp_open(&t, path));
    zr_status st;
    ZR_CHECK_GOTO(zr_file_tmp_write(&t, header, sizeof header), st, done);
    st = zr_file_tmp_write(&t, tokens, n * (size_t)k->token_bytes);
done:
    return zr_file_tmp_commit(&t, st); /* removes the temporary file when st is an error */
}

zr_status zr_shard_write(const char *path, const uint16_t *tokens, size_t n)
{
    return zr_shard_write_kind(path, ZR_DATA_GPT2, tokens, n);
}

/* ---- tokenizer -------------------------------------------------------------- */

void zr_bytes_encode(const void *text, size_t bytes, uint16_t *tokens)
{
    const unsigned char *s = text;
    for (size_t i = 0; i < bytes; i++) {
        tokens[i] = s[i];
    }
}

void zr_bytes_decode(const uint16_t *tokens, size_t n, char *text)
{
    for (size_t i = 0; i < n; i++) {
        text[i] = tokens[i] < 256 ? (char)(unsigned char)tokens[i] : '?';
    }
}

long long zr_text_check(const void *bytes, size_t n)
{
    const unsigned char *s = bytes;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c >= 0x01 && c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2, cp = c & 0x1f, min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3, cp = c & 0x0f, min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return (long long)i; /* NUL, a continuation byte, or a byte UTF-8 never uses */
        }
        if (n - i < len) {
            return (long long)i;
        }
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                return (long long)i;
            }
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        /* overlong forms, UTF-16 surrogates and code points past Unicode are not text */
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            return (long long)i;
        }
        i += len;
    }
    return -1;
}

/* ---- datasets --------------------------------------------------------------- */

void zr_dataset_free(zr_dataset *ds)
{
    if (ds == NULL) {
        return;
    }
    for (int i = 0; i < ds->nshards; i++) {
        if (ds->shards[i].map != NULL) {
            munmap(ds->shards[i].map, ds->shards[i].map_bytes);
        }
        zr_free(ds->shards[i].path);
    }
    zr_free(ds->shards);
    zr_free(ds->owned);
    memset(ds, 0, sizeof *ds);
}

static uint32_t max_of(const void *tokens, int token_bytes, size_t n)
{
    uint32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t t =
            token_bytes == 4 ? ((const uint32_t *)tokens)[i] : ((const uint16_t *)tokens)[i];
        mx = t > mx ? t : mx;
    }
    return mx;
}

/* A dataset of one file: its shard over tokens (owned: the dataset frees them). */
static zr_status one_shard(zr_dataset *ds, const char *path, const void *tokens, void *owned)
{
    ds->owned = owned;
    ds->tokens = tokens;
    ZR_ALLOC(ds->shards, 1);
    ds->nshards = 1;
    zr_data_shard *s = &ds->shards[0];
    size_t len = strlen(path) + 1;
    ZR_ALLOC(s->path, len);
    memcpy(s->path, path, len);
    s->tokens = tokens;
    s->n = ds->n;
    s->max_token = ds->max_token = max_of(tokens, ds->token_bytes, ds->n);
    return ZR_OK;
}

zr_status zr_dataset_from_tokens(zr_dataset *ds, const uint16_t *tokens, size_t n, int vocab)
{
    memset(ds, 0, sizeof *ds);
    uint16_t *copy;
    ZR_ALLOC(copy, n);
    memcpy(copy, tokens, n * sizeof *tokens);
    ds->token_bytes = 2;
    ds->n = n;
    ds->kind = vocab <= ZR_BYTE_VOCAB ? ZR_DATA_TEXT : ZR_DATA_GPT2;
    ds->vocab = vocab;
    zr_status st = one_shard(ds, "", copy, copy);
    if (st != ZR_OK) {
        zr_dataset_free(ds);
    }
    return st;
}

zr_status zr_dataset_set_vocab(zr_dataset *ds, const char *name, int vocab_size)
{
    if (vocab_size < 0 || vocab_size > ZR_VOCAB_MAX) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zr.model.vocab_size %d is out of range (0 = from the data, else 1 .. %d)",
                vocab_size, ZR_VOCAB_MAX);
    }
    int v = vocab_size > 0 ? vocab_size : kind_vocab(ds->kind);
    const char *file = name;
    size_t at = 0;
    uint32_t tok = 0;
    if (zr_dataset_find_beyond(ds, name, (uint32_t)v, &file, &at, &tok)) {
        if (vocab_size > 0) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "%s: token %u at position %zu does not fit zr.model.vocab_size %d; the data "
                    "needs at least %u",
                    file, tok, at, vocab_size, ds->max_token + 1);
        }
        ZR_FAIL(ZR_ERR_INVALID,
                "%s: token %u at position %zu is outside the vocabulary of its kind (%s: %d "
                "tokens); if the data comes from another tokenizer, set zr.model.vocab_size to "
                "its vocabulary size (at least %u)",
                file, tok, at, zr_data_kind_name(ds->kind), v, ds->max_token + 1);
    }
    ds->vocab = v;
    return ZR_OK;
}

/* Size of an open regular file. */
static zr_status open_size(FILE *f, const char *path, size_t *out)
{
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    }
    if ((uint64_t)sb.st_size >= (uint64_t)SIZE_MAX / 4) {
        ZR_FAIL(ZR_ERR_NOMEM, "%s is too large to load (%lld bytes)", path, (long long)sb.st_size);
    }
    *out = (size_t)sb.st_size;
    return ZR_OK;
}

static zr_status read_exact(FILE *f, const char *path, void *buf, size_t bytes)
{
    if (bytes > 0 && fread(buf, 1, bytes, f) != bytes) {
        ZR_FAIL(ZR_ERR_IO, "cannot read %s: %s", path,
                ferror(f) ? strerror(errno) : "the file shrank while it was read");
    }
    return ZR_OK;
}

/*
 * The tokens of a shard of kind k whose header h (ZR_SHARD_HEADER_INTS) has
 * been read from f (size bytes); f is positioned after the header.
 */
static zr_status read_shard(zr_dataset *ds, FILE *f, const char *path, size_t size,
                            const int32_t *h, const shard_kind *k)
{
    if (h[1] != k->version) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: %s version %d is not known (zr reads version %d); the file is damaged or "
                "was written by a newer llm.c",
                path, k->name, h[1], k->version);
    }
    size_t hdr = ZR_SHARD_HEADER_INTS * sizeof(int32_t);
    size_t count = h[2] < 0 ? 0 : (size_t)h[2];
    if (h[2] < 0 || size != hdr + count * (size_t)k->token_bytes) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: %s with a token count of %d in its header needs %zu bytes, the file has %zu "
                "(truncated or damaged)",
                path, k->name, h[2], hdr + count * (size_t)k->token_bytes, size);
    }
    /* mapped read-only: ranks share the page cache, and a rank holds only what it reads */
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fileno(f), 0);
    if (map == MAP_FAILED) {
        ZR_FAIL(ZR_ERR_IO, "cannot map %s (%zu bytes): %s", path, size, strerror(errno));
    }
    ds->token_bytes = k->token_bytes;
    ds->n = count;
    ds->kind = k->kind;
    ds->vocab = k->vocab;
    zr_status st = one_shard(ds, path, (const unsigned char *)map + hdr, NULL);
    if (st != ZR_OK) {
        munmap(map, size);
        return st;
    }
    ds->shards[0].map = map;
    ds->shards[0].map_bytes = size;
    return ZR_OK;
}

/* Appends the bytes of the text file f (size bytes) to *buf as tokens. */
static zr_status append_text(FILE *f, const char *path, size_t size, uint16_t **buf, size_t *len,
                             size_t *cap)
{
    zr_status st = ZR_OK;
    unsigned char *bytes = NULL;
    if (*len + size > *cap) {
        size_t ncap = (*len + size) * 2 + 4096;
        uint16_t *nb;
        ZR_ALLOC(nb, ncap);
        if (*len > 0) {
            memcpy(nb, *buf, *len * sizeof *nb);
        }
        zr_free(*buf);
        *buf = nb;
        *cap = ncap;
    }
    ZR_ALLOC_GOTO(bytes, size, st, done);
    ZR_CHECK_GOTO(read_exact(f, path, bytes, size), st, done);
    long long bad = zr_text_check(bytes, size);
    if (bad >= 0) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                     "%s is neither text nor an llm.c token shard: byte %lld (0x%02x) %s; zr "
                     "trains on UTF-8 text and on llm.c token shards (GPT-2: magic %d, "
                     "llama-3: magic %d)",
                     path, bad, bytes[bad],
                     bytes[bad] == 0 ? "is a NUL byte" : "is not valid UTF-8", ZR_SHARD_MAGIC,
                     ZR_SHARD_LLAMA3_MAGIC);
    }
    zr_bytes_encode(bytes, size, *buf + *len);
    *len += size;
done:
    zr_free(bytes);
    return st;
}

typedef enum want { WANT_ANY, WANT_SHARD, WANT_TEXT } want;

static zr_status load_file(zr_dataset *ds, const char *path, want w)
{
    memset(ds, 0, sizeof *ds);
    FILE *f;
    ZR_CHECK(zr_file_open_read(path, &f));
    zr_status st = ZR_OK;
    size_t size = 0, cap = 0;
    int32_t h[ZR_SHARD_HEADER_INTS] = {0};
    ZR_CHECK_GOTO(open_size(f, path, &size), st, done);
    size_t head = size < sizeof h ? size : sizeof h;
    ZR_CHECK_GOTO(read_exact(f, path, h, head), st, done);
    const shard_kind *k = NULL;
    for (size_t i = 0; head >= 4 && i < sizeof shard_kinds / sizeof shard_kinds[0]; i++) {
        k = h[0] == shard_kinds[i].magic ? &shard_kinds[i] : k;
    }
    for (size_t i = 0; head >= 4 && k == NULL && i < sizeof other_llmc / sizeof other_llmc[0];
         i++) {
        if (h[0] == other_llmc[i].magic) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s is %s (magic %d)", path, other_llmc[i].what,
                         h[0]);
        }
    }
    if (k != NULL && w == WANT_TEXT) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s is an %s (magic %d), not text", path, k->name,
                     h[0]);
    }
    if (k != NULL) {
        if (size < sizeof h) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                         "%s: truncated %s header (%zu bytes, the header alone needs %zu)", path,
                         k->name, size, sizeof h);
        }
        st = read_shard(ds, f, path, size, h, k);
        goto done;
    }
    if (w == WANT_SHARD) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                     "%s is not an llm.c token shard: magic %d (GPT-2 shards have %d, llama-3 "
                     "shards %d)",
                     path, head >= 4 ? h[0] : 0, ZR_SHARD_MAGIC, ZR_SHARD_LLAMA3_MAGIC);
    }
    rewind(f);
    uint16_t *buf = NULL;
    st = append_text(f, path, size, &buf, &ds->n, &cap);
    ds->owned = buf;
    if (st == ZR_OK) {
        ds->token_bytes = 2;
        ds->kind = ZR_DATA_TEXT;
        ds->vocab = ZR_BYTE_VOCAB;
        st = one_shard(ds, path, buf, buf);
    }
done:
    fclose(f);
    if (st != ZR_OK) {
        zr_dataset_free(ds);
    }
    return st;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Moves the one shard of part to the end of ds's shards (part is left empty). */
static zr_status take_shard(zr_dataset *ds, zr_dataset *part)
{
    zr_data_shard *ns;
    ZR_ALLOC(ns, (size_t)ds->nshards + 1);
    if (ds->nshards > 0) {
        memcpy(ns, ds->shards, (size_t)ds->nshards * sizeof *ns);
    }
    ns[ds->nshards] = part->shards[0];
    ns[ds->nshards].first = ds->n;
    zr_free(ds->shards);
    ds->shards = ns;
    ds->nshards++;
    ds->n += part->n;
    ds->max_token = part->max_token > ds->max_token ? part->max_token : ds->max_token;
    ds->tokens = ds->shards[0].tokens;
    memset(&part->shards[0], 0, sizeof part->shards[0]);
    zr_dataset_free(part);
    return ZR_OK;
}

/* The n sorted matches of pattern, each an llm.c shard, of one kind. */
static zr_status load_shards(zr_dataset *ds, const char *pattern, char **names, size_t n)
{
    memset(ds, 0, sizeof *ds);
    zr_status st = ZR_OK;
    for (size_t i = 0; i < n && st == ZR_OK; i++) {
        zr_dataset part;
        ZR_CHECK_GOTO(load_file(&part, names[i], WANT_SHARD), st, done);
        if (i > 0 && part.kind != ds->kind) {
            zr_data_kind other = part.kind;
            zr_dataset_free(&part);
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                         "%s matches shards of two kinds: %s is an %s, %s an %s; every shard of "
                         "one data set must have the same token width",
                         pattern, names[0], zr_data_kind_name(ds->kind), names[i],
                         zr_data_kind_name(other));
        }
        ds->kind = part.kind;
        ds->token_bytes = part.token_bytes;
        ds->vocab = part.vocab;
        st = take_shard(ds, &part);
        if (st != ZR_OK) {
            zr_dataset_free(&part);
        }
    }
done:
    if (st != ZR_OK) {
        zr_dataset_free(ds);
    }
    return st;
}

/* A path with glob characters that is not itself a file: its matches, sorted. */
static zr_status load_pattern(zr_dataset *ds, const char *pattern)
{
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        ZR_FAIL(ZR_ERR_IO, "the data pattern %s matches no file", pattern);
    }
    if (rc != 0) {
        globfree(&g);
        ZR_FAIL(ZR_ERR_IO, "cannot expand the data pattern %s (%s)", pattern,
                rc == GLOB_NOSPACE ? "out of memory" : "a directory cannot be read");
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str); /* byte order, any locale */
    zr_status st = g.gl_pathc == 1 ? load_file(ds, g.gl_pathv[0], WANT_ANY)
                                   : load_shards(ds, pattern, g.gl_pathv, g.gl_pathc);
    globfree(&g);
    return st;
}

zr_status zr_dataset_load(zr_dataset *ds, const char *path, int vocab_size)
{
    struct stat sb;
    if (strpbrk(path, "*?[") != NULL && stat(path, &sb) != 0) {
        ZR_CHECK(load_pattern(ds, path));
    } else {
        ZR_CHECK(load_file(ds, path, WANT_ANY));
    }
    zr_status st = zr_dataset_set_vocab(ds, path, vocab_size);
    if (st != ZR_OK) {
        zr_dataset_free(ds);
    }
    return st;
}

zr_status zr_dataset_load_shard(zr_dataset *ds, const char *path)
{
    return load_file(ds, path, WANT_SHARD);
}

zr_status zr_dataset_load_text(zr_dataset *ds, const char *path)
{
    return load_file(ds, path, WANT_TEXT);
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

/* Appends the text file at path to the corpus being built. */
static zr_status append_file(const char *path, uint16_t **buf, size_t *len, size_t *cap)
{
    FILE *f;
    ZR_CHECK(zr_file_open_read(path, &f));
    size_t size = 0;
    zr_status st;
    ZR_CHECK_GOTO(open_size(f, path, &size), st, done);
    st = append_text(f, path, size, buf, len, cap);
done:
    fclose(f);
    return st;
}

zr_status zr_dataset_load_fortunes(zr_dataset *ds, const char *dir)
{
    memset(ds, 0, sizeof *ds);
    if (dir == NULL) {
        dir = ZR_FORTUNES_DIR;
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        ZR_FAIL(ZR_ERR_IO,
                "%s: cannot open the default corpus (%s); run `make setup` to install the "
                "Debian package fortunes",
                dir, strerror(errno));
    }
    zr_status st = ZR_OK;
    char **names = NULL;
    uint16_t *buf = NULL;
    size_t count = 0, cap = 0, tcap = 0;
    char path[ZR_PATH_MAX];
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (nm[0] == '.' || has_suffix(nm, ".dat") || has_suffix(nm, ".u8")) {
            continue;
        }
        struct stat sb;
        if (snprintf(path, sizeof path, "%s/%s", dir, nm) >= (int)sizeof path ||
            stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            continue; /* sub-directories (off/) and dangling links are not corpus */
        }
        if (count == cap) {
            size_t ncap = cap * 2 + 64;
            char **nn;
            ZR_ALLOC_GOTO(nn, ncap, st, done);
            if (count > 0) {
                memcpy(nn, names, count * sizeof *nn);
            }
            zr_free(names);
            names = nn;
            cap = ncap;
        }
        size_t len = strlen(nm) + 1;
        ZR_ALLOC_GOTO(names[count], len, st, done);
        memcpy(names[count++], nm, len);
    }
    if (count == 0) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_IO,
                     "%s: no fortune files found; run `make setup` to install the Debian "
                     "package fortunes",
                     dir);
    }
    qsort(names, count, sizeof *names, cmp_str);
    for (size_t i = 0; i < count; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        ZR_CHECK_GOTO(append_file(path, &buf, &ds->n, &tcap), st, done);
    }
    ds->token_bytes = 2;
    ds->kind = ZR_DATA_TEXT;
    ds->vocab = ZR_BYTE_VOCAB;
    ds->owned = buf;
    buf = NULL; /* the dataset's now */
    st = one_shard(ds, dir, ds->owned, ds->owned);
done:
    zr_free(buf);
    for (size_t i = 0; i < count; i++) {
        zr_free(names[i]);
    }
    zr_free(names);
    closedir(d);
    if (st != ZR_OK) {
        zr_dataset_free(ds);
    }
    return st;
}
