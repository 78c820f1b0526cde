/*
 * ops_index.h - the index arithmetic of the device model's kernels
 * (ops_cuda.cu, norm_cuda.cu, xent_cuda.cu), written once as ZR_HD
 * functions so that the CPU tests check the same code the kernels run
 * (tests/test_ops_index.c).
 *
 * Every element offset is 64-bit: GPT-2 at B 64, T 1024 has B T Vp =
 * 3.3e9 logits, past 2^31, so no product of sizes may be formed in int.
 * Work items (chunks of 8 elements of a row, rows) are uint64_t; a column
 * inside a row stays int (a row is at most INT_MAX elements).
 *
 * Valid C11 and CUDA C++ (src/base/hd.h); internal to src/model.
 */
#ifndef ZR_MODEL_OPS_INDEX_H
#define ZR_MODEL_OPS_INDEX_H

#include "../base/hd.h"

#include <stddef.h>
#include <stdint.h>

/* Elements per chunk: 16 bytes of bf16, two 16-byte accesses of fp32. */
#define ZR_OP_CHUNK 8

/* Offset of element (row, col) of a row-major matrix with ld elements a row. */
ZR_HD uint64_t zr_op_offset(uint64_t row, int ld, int col)
{
    return row * (uint64_t)ld + (uint64_t)col;
}

/* Chunks of a row of cols elements (the last one may be short). */
ZR_HD int zr_op_row_chunks(int cols)
{
    return (cols + ZR_OP_CHUNK - 1) / ZR_OP_CHUNK;
}

/* Chunks of rows x cols, row by row. */
ZR_HD uint64_t zr_op_chunks(uint64_t rows, int cols)
{
    return rows * (uint64_t)zr_op_row_chunks(cols);
}

/*
 * Chunk q of rows of cols elements: its row, its first column (*col) and
 * its length (*m, 1..8); returns the offset of its first element.
 */
ZR_HD uint64_t zr_op_chunk_at(uint64_t q, int cols, uint64_t *row, int *col, int *m)
{
    uint64_t c8 = (uint64_t)zr_op_row_chunks(cols);
    *row = q / c8;
    *col = (int)(q % c8) * ZR_OP_CHUNK;
    *m = cols - *col < ZR_OP_CHUNK ? cols - *col : ZR_OP_CHUNK;
    return zr_op_offset(*row, cols, *col);
}

#endif /* ZR_MODEL_OPS_INDEX_H */
