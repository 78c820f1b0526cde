/*
 * loader.c - the batch loader: windows of T + 1 tokens, in order or in a
 * permutation per epoch, split over the ranks.
 *
 * The permutation is counter-based: window i of epoch e is a keyed bijection
 * of i (a four-round Feistel network on the next even power of two, walking
 * the cycle until the value falls inside the split), keyed by (seed, e)
 * alone. Nothing is stored and nothing depends on the windows already read,
 * so a resume at any position, world size or batch continues the same
 * stream, at the cost of one permutation per window.
 */
#include "zr/data.h"

#include <string.h>

zr_status zr_loader_init(zr_loader *l, const zr_dataset *ds, zr_split split, int B, int T, int rank,
                         int world)
{
    memset(l, 0, sizeof *l);
    if (B <= 0 || T <= 0 || world <= 0 || rank < 0 || rank >= world) {
        ZR_FAIL(ZR_ERR_INVALID, "loader: B = %d, T = %d, rank %d of %d is not valid", B, T, rank,
                world);
    }
    size_t val = ds->n * ZR_VAL_PERCENT / 100;
    size_t train_end = ds->n - val;
    l->ds = ds;
    l->begin = split == ZR_SPLIT_VAL ? train_end : 0;
    l->end = split == ZR_SPLIT_TRAIN ? train_end : ds->n;
    l->B = B;
    l->T = T;
    l->rank = rank;
    l->world = world;
    size_t global = (size_t)world * B * T;
    size_t have = l->end - l->begin;
    if (have < global + 1) {
        ZR_FAIL(ZR_ERR_INVALID,
                "loader: the %s %s %zu tokens, one global batch (%d rank%s x %d x %d) needs %zu",
                split == ZR_SPLIT_TRAIN ? "train split"
                : split == ZR_SPLIT_VAL ? "validation split"
                                        : "validation file",
                split == ZR_SPLIT_ALL ? "holds" : "has", have, world, world == 1 ? "" : "s", B, T,
                global + 1);
    }
    l->windows = (have - 1) / (size_t)T;
    l->batches_per_epoch = (have - 1) / global;
    return ZR_OK;
}

void zr_loader_shuffle(zr_loader *l, int shuffle, uint64_t seed)
{
    l->shuffle = shuffle != 0;
    l->seed = seed;
}

/* splitmix64's finaliser: a bijective mix of 64 bits. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* i's place in the permutation of [0, n) keyed by key. */
static uint64_t permute(uint64_t i, uint64_t n, uint64_t key)
{
    int bits = 1;
    while (bits < 64 && (1ULL << bits) < n) {
        bits++;
    }
    int half = (bits + 1) / 2;
    uint64_t mask = (1ULL << half) - 1;
    do { /* cycle walking: a bijection of [0, 4^half) restricted to [0, n) */
        uint64_t left = i >> half, right = i & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = mix64(key ^ mix64(right + (round << 40))) & mask;
            uint64_t next = left ^ f;
            left = right;
            right = next;
        }
        i = left << half | right;
    } while (i >= n);
    return i;
}

uint64_t zr_loader_window(const zr_loader *l, uint64_t k)
{
    uint64_t epoch = k / l->windows, i = k % l->windows;
    if (!l->shuffle || l->windows < 2) {
        return i;
    }
    return permute(i, l->windows, mix64(l->seed ^ mix64(epoch + 0x9e3779b97f4a7c15ULL)));
}

void zr_loader_next(zr_loader *l, int *inputs, int *targets)
{
    size_t T = (size_t)l->T;
    uint64_t k = l->position + (uint64_t)l->rank * (uint64_t)l->B;
    for (int b = 0; b < l->B; b++) {
        size_t start = l->begin + (size_t)zr_loader_window(l, k + (uint64_t)b) * T;
        zr_dataset_read(l->ds, start, T, inputs + (size_t)b * T);
        zr_dataset_read(l->ds, start + 1, T, targets + (size_t)b * T);
    }
    l->position += (uint64_t)l->world * (uint64_t)l->B;
}

uint64_t zr_loader_position(const zr_loader *l)
{
    return l->position / ((uint64_t)l->world * (uint64_t)l->B);
}

void zr_loader_seek(zr_loader *l, uint64_t position)
{
    l->position = position * (uint64_t)l->world * (uint64_t)l->B;
}

uint64_t zr_loader_windows(const zr_loader *l)
{
    return l->position;
}

void zr_loader_seek_windows(zr_loader *l, uint64_t windows)
{
    l->position = windows;
}

size_t zr_loader_batches_per_epoch(const zr_loader *l)
{
    return l->batches_per_epoch;
}
