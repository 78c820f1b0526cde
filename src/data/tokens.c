/*
 * tokens.c - a dataset's tokens across its shards: the shard of a token, a
 * range of tokens as ints, the first token beyond a vocabulary (named by
 * file and index), and the CRCs that identify the data (the same bytes give
 * the same CRC however they are cut into shards).
 */
#include "zr/data.h"

#include <string.h>

const zr_data_shard *zr_dataset_shard_of(const zr_dataset *ds, size_t i)
{
    int lo = 0, hi = ds->nshards - 1;
    while (lo < hi) { /* the last shard whose first token is <= i */
        int mid = (lo + hi + 1) / 2;
        if (ds->shards[mid].first <= i) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return &ds->shards[lo];
}

void zr_dataset_read(const zr_dataset *ds, size_t first, size_t n, int *out)
{
    /* tokens are below the vocabulary (at most ZR_VOCAB_MAX), so they fit an int */
    while (n > 0) {
        const zr_data_shard *s = zr_dataset_shard_of(ds, first);
        size_t at = first - s->first, k = s->n - at < n ? s->n - at : n;
        if (ds->token_bytes == 4) {
            const uint32_t *t = (const uint32_t *)s->tokens + at;
            for (size_t i = 0; i < k; i++) {
                out[i] = (int)t[i];
            }
        } else {
            const uint16_t *t = (const uint16_t *)s->tokens + at;
            for (size_t i = 0; i < k; i++) {
                out[i] = t[i];
            }
        }
        out += k;
        first += k;
        n -= k;
    }
}

int zr_dataset_find_beyond(const zr_dataset *ds, const char *name, uint32_t vocab,
                           const char **file, size_t *index, uint32_t *token)
{
    for (int i = 0; i < ds->nshards; i++) {
        const zr_data_shard *s = &ds->shards[i];
        if (s->n == 0 || s->max_token < vocab) {
            continue;
        }
        size_t at = 0;
        while (zr_dataset_token(ds, s->first + at) < vocab) {
            at++;
        }
        *file = ds->nshards > 1 ? s->path : name;
        *index = ds->nshards > 1 ? at : s->first + at;
        *token = zr_dataset_token(ds, s->first + at);
        return 1;
    }
    return 0;
}

/* CRC-32C of bytes [first, first + n) of the tokens as one byte sequence. */
static uint32_t crc_bytes(const zr_dataset *ds, uint32_t crc, size_t first, size_t n)
{
    size_t tb = (size_t)ds->token_bytes;
    for (int i = 0; i < ds->nshards && n > 0; i++) {
        const zr_data_shard *s = &ds->shards[i];
        size_t b0 = s->first * tb, b1 = b0 + s->n * tb;
        if (first >= b1) {
            continue;
        }
        size_t k = b1 - first < n ? b1 - first : n;
        crc = zr_crc32c(crc, (const unsigned char *)s->tokens + (first - b0), k);
        first += k;
        n -= k;
    }
    return crc;
}

#define ENDS_BYTES ((size_t)1 << 20)

uint32_t zr_dataset_ends_crc(const zr_dataset *ds)
{
    size_t bytes = ds->n * (size_t)ds->token_bytes;
    size_t head = bytes < ENDS_BYTES ? bytes : ENDS_BYTES;
    size_t tail = bytes - head < ENDS_BYTES ? bytes - head : ENDS_BYTES;
    uint32_t crc = bytes > 0 ? crc_bytes(ds, 0, 0, head) : 0;
    return tail > 0 ? crc_bytes(ds, crc, bytes - tail, tail) : crc;
}

uint32_t zr_dataset_names_crc(const zr_dataset *ds)
{
    uint32_t crc = 0;
    for (int i = 0; ds->nshards > 1 && i < ds->nshards; i++) {
        const char *p = ds->shards[i].path, *slash = strrchr(p, '/');
        p = slash != NULL ? slash + 1 : p;
        crc = zr_crc32c(crc, p, strlen(p) + 1);
    }
    return crc;
}
