/*
 * coll_local.c - the local work of the collectives (coll_impl.h,
 * zr_coll_local): everything an algorithm does between its exchanges, on
 * the CPU or on a GPU, behind one table, so each algorithm file keeps one
 * schedule for both.
 *
 *   zr_coll_local_cpu   host buffers (the MPI transport): the codec and
 *                       bf16 functions of zr/quant.h, done at once, on the
 *                       rank's threads (zr/pool.h) as they and the mean are.
 *   zr_coll_local_cuda  device buffers (a device transport): the same steps
 *                       as kernels of zr/quant_cuda.h, queued on the op's
 *                       codec stream; nothing waits on the host
 *                       (coll_local_cuda.c, built only with CUDA).
 *
 * Why a codec stream per op: the inputs are written on the stream the
 * communicator follows (the caller's compute stream), so an op's first step
 * waits for an event recorded there at start, and from then on its
 * quantization, sums and casts run beside the caller's later work. Its
 * exchanges follow the codec stream (zr_coll_dev_follow around each post),
 * so they start once the blocks they send are encoded, with no host wait in
 * the middle of the op; the local work after an exchange is queued when the
 * transport says the exchange is done (its bytes are then in place for any
 * stream). At the end the op records an event on the codec stream and
 * completes when the host sees it (zr_coll_test / zr_coll_wait poll it):
 * the output is then in place for work queued afterwards on any stream.
 *
 * Same bits as the CPU: the kernels run the CPU codec's rules
 * (quant_rules.h, bf16_rules.h), and the reductions add in the order the CPU
 * code does: the exact reduce-scatter's mean is ((row 0 + row 1) + ...) / n
 * in fp32 on both (zr_quant_cuda_sum_ranks), qgZ's sums are a decode then
 * decode-adds in rank order on both, its requantization the fused
 * decode-sum-requantize that is bit-identical to that sequence. So every
 * collective gives the CPU path's bytes on the same inputs, and the
 * exchanges are the same messages, so the traffic counters are too.
 *
 * Validation of received quantized blocks: the CPU validates each block
 * before decoding it. The device cannot without a host wait, so it copies
 * each block's 32-byte header to pinned memory on the codec stream and
 * validates them all, with the CPU's messages, when the op completes; a
 * block whose header does not match decodes to NaN in the kernels
 * (zr/quant_cuda.h) in the meantime, and the op fails with the first bad
 * block's message instead of succeeding.
 */
#include "coll_impl.h"

#include "zr/pool.h"

#include <stdio.h>
#include <string.h>

/* Elements summed per pass of the CPU mean: the partial sums stay in L1 while the terms stream. */
#define TILE 2048
/* Tiles per task of the mean on the pool: 64K elements, far over the pool's hand-off. */
#define MEAN_GRAIN 32

/* ---- the CPU ----------------------------------------------------------------------------- */

static zr_status cpu_copy(void *x, void *dst, const void *src, size_t bytes)
{
    (void)x;
    if (dst != src && bytes > 0) {
        memmove(dst, src, bytes);
    }
    return ZR_OK;
}

static zr_status cpu_zero(void *x, void *dst, size_t bytes)
{
    (void)x;
    if (bytes > 0) {
        memset(dst, 0, bytes);
    }
    return ZR_OK;
}

static zr_status cpu_to_bf16(void *x, zr_bf16 *dst, const float *src, size_t n)
{
    (void)x;
    zr_bf16_from_f32_n(dst, src, n);
    return ZR_OK;
}

static zr_status cpu_from_bf16(void *x, float *dst, const zr_bf16 *src, size_t n)
{
    (void)x;
    zr_bf16_to_f32_n(dst, src, n);
    return ZR_OK;
}

static zr_status cpu_encode(void *x, const zr_quant_params *p, zr_dtype in_type, const void *in,
                            size_t n, float mul, float *residual, void *block)
{
    (void)x;
    return zr_quant_encode(p, in_type, in, n, mul, residual, block, NULL);
}

static zr_status cpu_decode(void *x, const void *block, zr_dtype out_type, void *out, size_t n)
{
    (void)x;
    return zr_quant_decode(block, out_type, out, n);
}

static zr_status cpu_decode_add(void *x, const void *block, float *acc, size_t n)
{
    (void)x;
    return zr_quant_decode_add(block, acc, n);
}

static zr_status cpu_sum_requant(void *x, const void *const *blocks, int k, size_t n, float mul,
                                 const zr_quant_params *p, float *residual, void *out_block)
{
    (void)x;
    return zr_quant_sum_requant(blocks, k, n, mul, p, residual, out_block, NULL);
}

typedef struct mean_job {
    float *out;
    const void *in;
    zr_dtype in_type;
    int k;
    size_t stride, count;
} mean_job;

/* Tiles [t0, t1) of the mean: each element's sum in rank order, whichever thread runs it. */
static void mean_task(void *arg, size_t t0, size_t t1, int thread)
{
    (void)thread;
    const mean_job *j = arg;
    float tmp[TILE];
    for (size_t t = t0; t < t1; t++) {
        size_t e0 = t * TILE, m = j->count - e0 < TILE ? j->count - e0 : TILE;
        float *o = j->out + e0;
        for (int p = 0; p < j->k; p++) {
            const float *term = tmp;
            if (j->in_type == ZR_DTYPE_BF16) {
                zr_bf16_to_f32_n(tmp, (const zr_bf16 *)j->in + (size_t)p * j->stride + e0, m);
            } else {
                term = (const float *)j->in + (size_t)p * j->stride + e0;
            }
            if (p == 0) {
                for (size_t i = 0; i < m; i++) {
                    o[i] = term[i];
                }
            } else {
                for (size_t i = 0; i < m; i++) {
                    o[i] += term[i];
                }
            }
        }
        /* a true division: the correctly rounded mean of the fp32 sum */
        float fn = (float)j->k;
        for (size_t i = 0; i < m; i++) {
            o[i] /= fn;
        }
    }
}

/* The exact reduce-scatter's mean, tiles split over the process's pool (same bits at any count). */
static zr_status cpu_mean(void *x, float *out, const void *in, zr_dtype in_type, int k,
                          size_t stride, size_t count)
{
    (void)x;
    mean_job j = {out, in, in_type, k, stride, count};
    zr_parallel_for(zr_div_up(count, TILE), MEAN_GRAIN, mean_task, &j);
    return ZR_OK;
}

static zr_status cpu_expect_checks(void *x, size_t n)
{
    (void)x;
    (void)n;
    return ZR_OK;
}

zr_status zr_coll_check_now(zr_comm *c, zr_coll_op *op, const void *block, const zr_coll_check *k)
{
    zr_status st = zr_quant_validate(block, k->bytes, &k->q, k->count);
    if (st != ZR_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", zr_error_message());
        ZR_FAIL(st, "%s: block from world rank %d (group %s) is invalid: %s", k->what,
                zr_comm_world_rank(c, k->group, k->peer), zr_group_name(k->group), why);
    }
    if (k->add_nonfinite) {
        op->nonfinite += zr_coll_block_nonfinite(block);
    }
    return ZR_OK;
}

static zr_status cpu_check(void *x, zr_comm *c, zr_coll_op *op, const void *block,
                           const zr_coll_check *k)
{
    (void)x;
    return zr_coll_check_now(c, op, block, k);
}

static zr_status cpu_ptr_array(zr_coll_op *op, void *carved, size_t bytes, void **out)
{
    (void)op;
    (void)bytes;
    *out = carved;
    return ZR_OK;
}

static zr_status cpu_cut(zr_stream *follow, zr_dtype dst_type, void *dst, zr_dtype src_type,
                         const void *src, size_t n)
{
    (void)follow;
    if (dst_type == src_type) {
        memcpy(dst, src, n * zr_dtype_size(src_type));
    } else if (dst_type == ZR_DTYPE_BF16) {
        zr_bf16_from_f32_n(dst, src, n);
    } else {
        zr_bf16_to_f32_n(dst, src, n);
    }
    return ZR_OK;
}

/* The device part on the CPU: nothing is queued, so an op is complete with its last step. */
static zr_status cpu_start(zr_coll_dev **dev, const zr_device *d, zr_stream *follow)
{
    (void)dev;
    (void)d;
    (void)follow;
    return ZR_OK;
}

static zr_status cpu_finish(void *x, int *done)
{
    (void)x;
    *done = 1;
    return ZR_OK;
}

static zr_status cpu_poll(zr_comm *c, void *x, zr_coll_op *op, int block, int *done)
{
    (void)c;
    (void)x;
    (void)op;
    (void)block;
    *done = 1;
    return ZR_OK;
}

static void cpu_drain(void *x)
{
    (void)x;
}

static zr_status cpu_follow(void *x, zr_comm *c, zr_stream **prev)
{
    (void)x;
    (void)c;
    *prev = NULL;
    return ZR_OK;
}

static zr_status cpu_unfollow(void *x, zr_comm *c, zr_stream *prev)
{
    (void)x;
    (void)c;
    (void)prev;
    return ZR_OK;
}

const zr_coll_local zr_coll_local_cpu = {
    .name = "cpu",
    .copy = cpu_copy,
    .zero = cpu_zero,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .encode = cpu_encode,
    .decode = cpu_decode,
    .decode_add = cpu_decode_add,
    .sum_requant = cpu_sum_requant,
    .mean = cpu_mean,
    .expect_checks = cpu_expect_checks,
    .check = cpu_check,
    .ptr_array = cpu_ptr_array,
    .cut = cpu_cut,
    .start = cpu_start,
    .finish = cpu_finish,
    .poll = cpu_poll,
    .drain = cpu_drain,
    .follow = cpu_follow,
    .unfollow = cpu_unfollow,
};

zr_status zr_coll_convert(const zr_coll_local *L, void *x, zr_dtype dst_type, void *dst,
                          zr_dtype src_type, const void *src, size_t n)
{
    if (dst_type == src_type) {
        return L->copy(x, dst, src, n * zr_dtype_size(src_type));
    }
    if (dst_type == ZR_DTYPE_BF16) {
        return L->to_bf16(x, dst, src, n);
    }
    return L->from_bf16(x, dst, src, n);
}
