/*
 * data.c - token shards, the byte tokenizer, datasets and the batch loader.
 *
 * Shard files follow llm.c (a 256 x int32 header with magic 20240520,
 * version 1 and the token count, then uint16 tokens) so that data prepared
 * by llm.c's scripts trains here unchanged. Files are validated completely
 * before use: a wrong size is reported, not read as garbage tokens.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/data.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- file helpers ----------------------------------------------------------- */

/* Size of an open file in bytes. */
static zr_status file_size(FILE *f, const char *path, size_t *out)
{
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "%s: stat failed: %s", path, strerror(errno));
    }
    *out = (size_t)sb.st_size;
    return ZR_OK;
}

static zr_status write_all(FILE *f, const char *path, const void *data, size_t bytes)
{
    if (bytes > 0 && fwrite(data, 1, bytes, f) != bytes) {
        ZR_FAIL(ZR_ERR_IO, "%s: write of %zu bytes failed: %s", path, bytes, strerror(errno));
    }
    return ZR_OK;
}

/* Flush, fsync and close f (written as tmp), then rename tmp to path. */
static zr_status commit_file(FILE *f, const char *tmp, const char *path)
{
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        int e = errno;
        fclose(f);
        remove(tmp);
        ZR_FAIL(ZR_ERR_IO, "%s: flush/fsync failed: %s", tmp, strerror(e));
    }
    if (fclose(f) != 0) {
        int e = errno;
        remove(tmp);
        ZR_FAIL(ZR_ERR_IO, "%s: close failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        ZR_FAIL(ZR_ERR_IO, "rename %s -> %s failed: %s", tmp, path, strerror(e));
    }
    return ZR_OK;
}

/* ---- shards ----------------------------------------------------------------- */

zr_status zr_shard_write(const char *path, const uint16_t *tokens, size_t n)
{
    if (n > INT32_MAX) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: %zu tokens do not fit the shard header's int32 count", path,
                n);
    }
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: path too long", path);
    }
    int32_t header[ZR_SHARD_HEADER_INTS] = {0};
    header[0] = ZR_SHARD_MAGIC;
    header[1] = ZR_SHARD_VERSION;
    header[2] = (int32_t)n;
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    zr_status st = write_all(f, tmp, header, sizeof header);
    if (st == ZR_OK) {
        st = write_all(f, tmp, tokens, n * sizeof *tokens);
    }
    if (st != ZR_OK) {
        fclose(f);
        remove(tmp);
        return st;
    }
    return commit_file(f, tmp, path);
}

zr_status zr_shard_read(const char *path, uint16_t **tokens, size_t *n)
{
    *tokens = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "%s: cannot open token shard: %s", path, strerror(errno));
    }
    zr_status st = ZR_OK;
    uint16_t *buf = NULL;
    size_t size = 0;
    int32_t header[ZR_SHARD_HEADER_INTS];
    ZR_CHECK_GOTO(file_size(f, path, &size), st, done);
    if (size < sizeof header || fread(header, sizeof header, 1, f) != 1) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: truncated token shard header (%zu bytes, need %zu)", path, size,
                         sizeof header);
        goto done;
    }
    if (header[0] != ZR_SHARD_MAGIC) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: not a token shard: magic %d, expected %d", path, header[0],
                         ZR_SHARD_MAGIC);
        goto done;
    }
    if (header[1] != ZR_SHARD_VERSION) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: token shard version %d, expected %d", path, header[1],
                         ZR_SHARD_VERSION);
        goto done;
    }
    if (header[2] < 0 || size != sizeof header + (size_t)header[2] * sizeof(uint16_t)) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: token count %d in the header needs %zu bytes, file has %zu "
                         "(truncated or corrupt)",
                         path, header[2],
                         sizeof header + (size_t)(header[2] < 0 ? 0 : header[2]) * 2, size);
        goto done;
    }
    size_t count = (size_t)header[2];
    ZR_CHECK_GOTO(zr_alloc_at((void **)&buf, count * sizeof *buf, __FILE__, __LINE__), st, done);
    if (count > 0 && fread(buf, sizeof *buf, count, f) != count) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "%s: read of %zu tokens failed", path,
                         count);
        goto done;
    }
    *tokens = buf;
    *n = count;
    buf = NULL;
done:
    zr_free(buf);
    fclose(f);
    return st;
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

/* ---- datasets --------------------------------------------------------------- */

void zr_dataset_free(zr_dataset *ds)
{
    if (ds != NULL) {
        zr_free(ds->tokens);
        memset(ds, 0, sizeof *ds);
    }
}

zr_status zr_dataset_from_tokens(zr_dataset *ds, const uint16_t *tokens, size_t n, int vocab)
{
    memset(ds, 0, sizeof *ds);
    ZR_ALLOC(ds->tokens, n);
    memcpy(ds->tokens, tokens, n * sizeof *tokens);
    ds->n = n;
    ds->vocab = vocab;
    return ZR_OK;
}

zr_status zr_dataset_load_shard(zr_dataset *ds, const char *path)
{
    memset(ds, 0, sizeof *ds);
    ZR_CHECK(zr_shard_read(path, &ds->tokens, &ds->n));
    int mx = 0;
    for (size_t i = 0; i < ds->n; i++) {
        mx = ds->tokens[i] > mx ? ds->tokens[i] : mx;
    }
    ds->vocab = mx + 1;
    return ZR_OK;
}

/* Appends the bytes of path to *buf (capacity *cap, length *len) as tokens. */
static zr_status append_file(const char *path, uint16_t **buf, size_t *len, size_t *cap)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    zr_status st = ZR_OK;
    unsigned char *bytes = NULL;
    size_t size = 0;
    ZR_CHECK_GOTO(file_size(f, path, &size), st, done);
    if (*len + size > *cap) {
        size_t ncap = (*len + size) * 2 + 4096;
        uint16_t *nb;
        ZR_CHECK_GOTO(zr_alloc_at((void **)&nb, ncap * sizeof *nb, __FILE__, __LINE__), st, done);
        if (*len > 0) {
            memcpy(nb, *buf, *len * sizeof *nb);
        }
        zr_free(*buf);
        *buf = nb;
        *cap = ncap;
    }
    ZR_CHECK_GOTO(zr_alloc_at((void **)&bytes, size, __FILE__, __LINE__), st, done);
    if (size > 0 && fread(bytes, 1, size, f) != size) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "%s: read of %zu bytes failed", path,
                         size);
        goto done;
    }
    zr_bytes_encode(bytes, size, *buf + *len);
    *len += size;
done:
    zr_free(bytes);
    fclose(f);
    return st;
}

zr_status zr_dataset_load_text(zr_dataset *ds, const char *path)
{
    memset(ds, 0, sizeof *ds);
    size_t cap = 0;
    zr_status st = append_file(path, &ds->tokens, &ds->n, &cap);
    if (st != ZR_OK) {
        zr_dataset_free(ds);
        return st;
    }
    ds->vocab = ZR_BYTE_VOCAB;
    return ZR_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
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
    size_t count = 0, cap = 0, tcap = 0;
    char path[4096];
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
            ZR_CHECK_GOTO(zr_alloc_at((void **)&nn, ncap * sizeof *nn, __FILE__, __LINE__), st,
                          done);
            if (count > 0) {
                memcpy(nn, names, count * sizeof *nn);
            }
            zr_free(names);
            names = nn;
            cap = ncap;
        }
        size_t len = strlen(nm) + 1;
        ZR_CHECK_GOTO(zr_alloc_at((void **)&names[count], len, __FILE__, __LINE__), st, done);
        memcpy(names[count++], nm, len);
    }
    if (count == 0) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__,
                         "%s: no fortune files found; run `make setup` to install the Debian "
                         "package fortunes",
                         dir);
        goto done;
    }
    qsort(names, count, sizeof *names, cmp_str);
    for (size_t i = 0; i < count; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        ZR_CHECK_GOTO(append_file(path, &ds->tokens, &ds->n, &tcap), st, done);
    }
    ds->vocab = ZR_BYTE_VOCAB;
done:
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

/* ---- loader ----------------------------------------------------------------- */

zr_status zr_loader_init(zr_loader *l, const zr_dataset *ds, zr_split split, int B, int T,
                         int rank, int world)
{
    memset(l, 0, sizeof *l);
    if (B <= 0 || T <= 0 || world <= 0 || rank < 0 || rank >= world) {
        ZR_FAIL(ZR_ERR_INVALID, "loader: B = %d, T = %d, rank %d of %d is not valid", B, T, rank,
                world);
    }
    size_t val = ds->n * ZR_VAL_PERCENT / 100;
    size_t train_end = ds->n - val;
    l->tokens = ds->tokens;
    l->begin = split == ZR_SPLIT_TRAIN ? 0 : train_end;
    l->end = split == ZR_SPLIT_TRAIN ? train_end : ds->n;
    l->B = B;
    l->T = T;
    l->rank = rank;
    l->world = world;
    size_t global = (size_t)world * B * T;
    size_t have = l->end - l->begin;
    if (have < global + 1) {
        ZR_FAIL(ZR_ERR_INVALID,
                "loader: the %s split has %zu tokens, one global batch (%d ranks x %d x %d) "
                "needs %zu",
                split == ZR_SPLIT_TRAIN ? "train" : "validation", have, world, B, T, global + 1);
    }
    l->batches_per_epoch = (have - 1) / global;
    return ZR_OK;
}

void zr_loader_next(zr_loader *l, int *inputs, int *targets)
{
    size_t global = (size_t)l->world * l->B * l->T;
    size_t local = (size_t)l->B * l->T;
    size_t start = l->begin + (size_t)(l->position % l->batches_per_epoch) * global +
                   (size_t)l->rank * local;
    const uint16_t *t = l->tokens + start;
    for (size_t i = 0; i < local; i++) {
        inputs[i] = t[i];
        targets[i] = t[i + 1];
    }
    l->position++;
}

uint64_t zr_loader_position(const zr_loader *l)
{
    return l->position;
}

void zr_loader_seek(zr_loader *l, uint64_t position)
{
    l->position = position;
}

size_t zr_loader_batches_per_epoch(const zr_loader *l)
{
    return l->batches_per_epoch;
}
