/*
 * test_ops_index.c - the device model's index arithmetic (src/model/
 * ops_index.h) at sizes past 2^31 elements, on the CPU: the emulator cannot
 * hold GPT-2's B 64 x T 1024 x Vp 50304 = 3.3e9 logits, so the helpers the
 * kernels call are checked here directly.
 *
 *   offset    (row, col) of the last logit (and at B 128, past 2^32), of
 *             the last 4C activation, and
 *             a spread of rows past 2^31 / ld, against the product in
 *             uint64 written out here.
 *   chunks    the count of 8-element chunks of rows x cols (cols a multiple
 *             of 8 and not: V = 50257), past 2^32.
 *   chunk_at  chunk q -> (row, col, length, offset) for the first, the
 *             last of a row (short where cols is not a multiple of 8), the
 *             last of all, and 4096 chunks spread over the range, each
 *             against the division written out here; the chunks of a row
 *             tile it exactly (lengths sum to cols).
 */
#include "test.h"

#include "../src/model/ops_index.h" /* internal to src/model */

#define GPT2_B  64ULL
#define GPT2_T  1024ULL
#define GPT2_VP 50304
#define GPT2_V  50257
#define GPT2_4C 3072

static void test_offset(void)
{
    uint64_t rows = GPT2_B * GPT2_T;
    uint64_t last = zr_op_offset(rows - 1, GPT2_VP, GPT2_VP - 1);
    TEST_CHECK(last == rows * 50304ULL - 1);
    TEST_CHECK(last == 3296722943ULL); /* past 2^31 */
    /* B 128: past 2^32 too */
    TEST_CHECK(zr_op_offset(2 * rows - 1, GPT2_VP, GPT2_VP - 1) == 6593445887ULL);
    TEST_CHECK(zr_op_offset(rows - 1, GPT2_4C, GPT2_4C - 1) == rows * 3072ULL - 1);
    for (uint64_t r = 40000; r < rows; r += 777) {
        for (int c = 0; c < GPT2_VP; c += 4099) {
            uint64_t want = r * 50304ULL + (uint64_t)c;
            TEST_CHECKF(zr_op_offset(r, GPT2_VP, c) == want, "offset of (%llu, %d)",
                        (unsigned long long)r, c);
        }
    }
}

static void test_chunks(void)
{
    TEST_CHECK(zr_op_row_chunks(1) == 1);
    TEST_CHECK(zr_op_row_chunks(8) == 1);
    TEST_CHECK(zr_op_row_chunks(9) == 2);
    TEST_CHECK(zr_op_row_chunks(GPT2_V) == 6283);
    TEST_CHECK(zr_op_chunks(GPT2_B * GPT2_T, GPT2_VP) == 65536ULL * 6288ULL);
    TEST_CHECK(zr_op_chunks(1ULL << 30, GPT2_VP) == (1ULL << 30) * 6288ULL); /* past 2^32 */
}

/* chunk q of rows of cols elements, checked against the division written out */
static void chunk_case(uint64_t q, int cols)
{
    uint64_t c8 = ((uint64_t)cols + 7) / 8, row = 0;
    int col = -1, m = -1;
    uint64_t at = zr_op_chunk_at(q, cols, &row, &col, &m);
    uint64_t wrow = q / c8, wcol = (q % c8) * 8;
    uint64_t wm = (uint64_t)cols - wcol < 8 ? (uint64_t)cols - wcol : 8;
    TEST_CHECKF(row == wrow && (uint64_t)col == wcol && (uint64_t)m == wm &&
                    at == wrow * (uint64_t)cols + wcol,
                "chunk %llu of rows of %d: row %llu col %d m %d offset %llu", (unsigned long long)q,
                cols, (unsigned long long)row, col, m, (unsigned long long)at);
}

static void test_chunk_at(void)
{
    const int widths[] = {GPT2_VP, GPT2_V, GPT2_4C, 36, 1};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        int cols = widths[w];
        uint64_t n = zr_op_chunks(GPT2_B * GPT2_T, cols), c8 = (uint64_t)zr_op_row_chunks(cols);
        chunk_case(0, cols);
        chunk_case(c8 - 1, cols);
        chunk_case(n - 1, cols);
        for (uint64_t k = 0; k < 4096; k++) {
            chunk_case(k * (n / 4096) + k % 7, cols);
        }
        /* the chunks of the last row tile it: consecutive, lengths summing to cols */
        uint64_t next = (GPT2_B * GPT2_T - 1) * (uint64_t)cols, row = 0;
        for (uint64_t q = n - c8; q < n; q++) {
            int col, m;
            uint64_t at = zr_op_chunk_at(q, cols, &row, &col, &m);
            TEST_CHECKF(at == next, "chunk %llu of rows of %d starts at %llu, not %llu",
                        (unsigned long long)q, cols, (unsigned long long)at,
                        (unsigned long long)next);
            next = at + (uint64_t)m;
        }
        TEST_CHECK(next == GPT2_B * GPT2_T * (uint64_t)cols);
    }
    /* the last logit's chunk of GPT-2 at B 64: row 65535, a short chunk of 1 when V = 50257 */
    uint64_t row;
    int col, m;
    uint64_t at = zr_op_chunk_at(zr_op_chunks(GPT2_B * GPT2_T, GPT2_V) - 1, GPT2_V, &row, &col, &m);
    TEST_CHECK(row == 65535 && col == 50256 && m == 1 && at == 65536ULL * 50257ULL - 1);
}

int main(void)
{
    TEST_RUN(test_offset);
    TEST_RUN(test_chunks);
    TEST_RUN(test_chunk_at);
    return zr_test_finish();
}
