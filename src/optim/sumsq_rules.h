/*
 * sumsq_rules.h - the order in which the CUDA sum of squares (adamw_cuda.cu)
 * adds, written down so that the CPU can add in the same order
 * (zr_sumsq_cuda_order in optim.c) and the kernel's result can be
 * checked bit for bit. The order depends only on n, never on the GPU.
 *
 *   tiles     the input in tiles of ZR_SUMSQ_TILE elements; tile t is summed
 *             by block t mod P, P = min(number of tiles, ZR_SUMSQ_BLOCKS)
 *             (at least 1), the block's tiles in increasing order
 *   threads   in a tile, thread i (of ZR_SUMSQ_THREADS) adds, in this order,
 *             the elements 4 i + {0,1,2,3} of each of the tile's quarters
 *             (quarter j starts at j * 4 * ZR_SUMSQ_THREADS): acc += d * d in
 *             double, d the element widened, elements past n skipped
 *   tree      then s[i] = s[i] + s[i + h] for h = THREADS/2, ..., 1, over
 *             the block's threads; s[0] is the block's partial
 *   final     the P partials (zeros past P) by the same tree over
 *             ZR_SUMSQ_BLOCKS entries
 * Squares are never negative, so the zeros added by the last step change
 * nothing but the order is still fixed. Valid C11 and CUDA C++.
 */
#ifndef ZR_SUMSQ_RULES_H
#define ZR_SUMSQ_RULES_H

#include "../base/hd.h"

#include <stdint.h>

#define ZR_SUMSQ_THREADS 256
#define ZR_SUMSQ_TILE    (4 * 4 * ZR_SUMSQ_THREADS) /* 4 quarters of one float4 per thread */
#define ZR_SUMSQ_BLOCKS  1024                       /* the most partials, and the final tree */

/* Number of partials (blocks of the first kernel) for n elements. */
ZR_HD uint64_t zr_sumsq_partials(uint64_t n)
{
    uint64_t tiles = (n + ZR_SUMSQ_TILE - 1) / ZR_SUMSQ_TILE;
    return tiles < 1 ? 1 : tiles > ZR_SUMSQ_BLOCKS ? ZR_SUMSQ_BLOCKS : tiles;
}

/* One element's contribution, as the CPU's zr_sumsq adds it. */
ZR_HD double zr_sumsq_add(double acc, float x)
{
    double d = (double)x;
    return acc + d * d;
}

#endif /* ZR_SUMSQ_RULES_H */
