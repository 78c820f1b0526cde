/*
 * coll_local_cuda.c - zr_coll_local_cuda: the collectives' local work on
 * device buffers (coll_local.c says what the table is and why each op has a
 * codec stream), as kernels of zr/quant_cuda.h queued on the op's codec
 * stream, and the device part of an op (the table's start, finish, poll,
 * drain and follow members, coll_impl.h). Compiled only where CUDA is
 * built; a build without compiles coll_nocuda.c instead.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include "coll_impl.h"

#include "../base/device_impl.h"
#include "zr/quant_cuda.h"

#include <string.h>
#include <time.h>

#define HEADER_BYTES 32 /* sizeof(zr_quant_header): what validation reads */

struct zr_coll_dev {
    zr_device dev;
    zr_stream *codec;    /* the op's local work */
    cudaEvent_t start;   /* recorded on the followed stream when an op starts */
    cudaEvent_t final;   /* recorded on codec after the op's last step */
    unsigned char *hdr;  /* pinned: the headers of the blocks to check */
    zr_coll_check *chk;  /* what each header is checked against */
    size_t nchk, capchk; /* checks queued in this op, room */
};

/* *devp on GPU d: kept when it already is, else (re)created: codec stream, events. */
static zr_status attach(zr_coll_dev **devp, const zr_device *d)
{
    zr_coll_dev *x = *devp;
    if (x != NULL && x->dev.ordinal == d->ordinal) {
        return ZR_OK;
    }
    zr_coll_dev_free(x);
    *devp = NULL;
    ZR_ALLOC(x, 1);
    x->dev = *d;
    zr_status st = zr_stream_create(d, &x->codec);
    if (st == ZR_OK) {
        ZR_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&x->start, cudaEventDisableTiming), st, fail);
        ZR_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&x->final, cudaEventDisableTiming), st, fail);
        *devp = x;
        return ZR_OK;
    }
fail:
    zr_coll_dev_free(x);
    return st;
}

void zr_coll_dev_free(zr_coll_dev *x)
{
    if (x == NULL) {
        return;
    }
    if (x->codec != NULL) {
        /* an op abandoned in flight may still have copies into the pinned headers */
        (void)zr_stream_sync(x->codec);
    }
    if (x->start != NULL) {
        cudaEventDestroy(x->start);
    }
    if (x->final != NULL) {
        cudaEventDestroy(x->final);
    }
    zr_host_free_pinned(&x->dev, x->hdr);
    zr_free(x->chk);
    zr_stream_destroy(x->codec);
    zr_free(x);
}

static zr_status dev_start(zr_coll_dev **devp, const zr_device *d, zr_stream *follow)
{
    ZR_CHECK(attach(devp, d));
    zr_coll_dev *x = *devp;
    x->nchk = 0;
    ZR_CUDA_CHECK(cudaEventRecord(x->start, follow != NULL ? zr_stream_cuda(follow) : NULL));
    ZR_CUDA_CHECK(cudaStreamWaitEvent(zr_stream_cuda(x->codec), x->start, 0));
    return ZR_OK;
}

/* The last step is queued: mark the end of the codec stream's work; completion is polled. */
static zr_status dev_finish(void *xp, int *done)
{
    zr_coll_dev *x = xp;
    *done = 0;
    ZR_CUDA_CHECK(cudaEventRecord(x->final, zr_stream_cuda(x->codec)));
    return ZR_OK;
}

/* The headers copied during the op, checked in the order they were queued. */
static zr_status run_checks(zr_comm *c, zr_coll_dev *x, zr_coll_op *op)
{
    for (size_t i = 0; i < x->nchk; i++) {
        /* a block shorter than a header: validation says so before it reads the header */
        ZR_CHECK(zr_coll_check_now(c, op, x->hdr + i * HEADER_BYTES, &x->chk[i]));
    }
    x->nchk = 0;
    return ZR_OK;
}

static zr_status dev_poll(zr_comm *c, void *xp, zr_coll_op *op, int block, int *done)
{
    zr_coll_dev *x = xp;
    *done = 0;
    for (unsigned spins = 0;; spins++) {
        cudaError_t err = cudaEventQuery(x->final);
        if (err == cudaSuccess) {
            break;
        }
        if (err != cudaErrorNotReady) {
            ZR_CUDA_CHECK(err);
        }
        (void)cudaGetLastError();
        if (!block) {
            return ZR_OK;
        }
        /* only local kernels are left; other ops' exchanges keep moving meanwhile */
        if (c->inflight > 0 && c->transport->progress != NULL) {
            c->transport->progress(c);
        }
        if (spins > 64) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    ZR_CHECK(run_checks(c, x, op));
    *done = 1;
    return ZR_OK;
}

static void dev_drain(void *xp)
{
    zr_coll_dev *x = xp;
    if (zr_stream_sync(x->codec) != ZR_OK) {
        ZR_WARN("a failed collective's codec stream did not drain: %s", zr_error_message());
    }
    x->nchk = 0;
}

static zr_status dev_follow(void *xp, zr_comm *c, zr_stream **prev)
{
    zr_coll_dev *x = xp;
    (void)zr_comm_device(c, prev);
    return zr_comm_device_follow(c, x->codec);
}

static zr_status dev_unfollow(void *xp, zr_comm *c, zr_stream *prev)
{
    (void)xp;
    return zr_comm_device_follow(c, prev);
}

static zr_status dev_copy(void *x, void *dst, const void *src, size_t bytes)
{
    zr_coll_dev *d = x;
    if (dst == src || bytes == 0) {
        return ZR_OK;
    }
    return zr_memcpy_async(dst, src, bytes, d->codec);
}

static zr_status dev_zero(void *x, void *dst, size_t bytes)
{
    zr_coll_dev *d = x;
    return zr_memset_async(dst, 0, bytes, d->codec);
}

static zr_status dev_to_bf16(void *x, zr_bf16 *dst, const float *src, size_t n)
{
    zr_coll_dev *d = x;
    return zr_bf16_cuda_from_f32(dst, src, n, d->codec);
}

static zr_status dev_from_bf16(void *x, float *dst, const zr_bf16 *src, size_t n)
{
    zr_coll_dev *d = x;
    return zr_bf16_cuda_to_f32(dst, src, n, d->codec);
}

static zr_status dev_encode(void *x, const zr_quant_params *p, zr_dtype in_type, const void *in,
                            size_t n, float mul, float *residual, void *block)
{
    zr_coll_dev *d = x;
    return zr_quant_cuda_encode(p, in_type, in, n, mul, residual, block, d->codec);
}

static zr_status dev_decode(void *x, const void *block, zr_dtype out_type, void *out, size_t n)
{
    zr_coll_dev *d = x;
    return zr_quant_cuda_decode(block, out_type, out, n, d->codec);
}

static zr_status dev_decode_add(void *x, const void *block, float *acc, size_t n)
{
    zr_coll_dev *d = x;
    return zr_quant_cuda_decode_add(block, acc, n, d->codec);
}

static zr_status dev_sum_requant(void *x, const void *const *blocks, int k, size_t n, float mul,
                                 const zr_quant_params *p, float *residual, void *out_block)
{
    zr_coll_dev *d = x;
    return zr_quant_cuda_sum_requant(blocks, k, n, mul, p, residual, out_block, d->codec);
}

static zr_status dev_mean(void *x, float *out, const void *in, zr_dtype in_type, int k,
                          size_t stride, size_t count)
{
    zr_coll_dev *d = x;
    if (count == 0) {
        return ZR_OK;
    }
    return zr_quant_cuda_sum_ranks(out, in, in_type, k, stride, count, (float)k, d->codec);
}

static zr_status dev_expect_checks(void *x, size_t n)
{
    zr_coll_dev *d = x;
    ZR_ASSERT(d->nchk == 0);
    if (n <= d->capchk) {
        return ZR_OK;
    }
    /* no copy into the old headers is pending: the previous op completed or drained */
    zr_host_free_pinned(&d->dev, d->hdr);
    zr_free(d->chk);
    d->hdr = NULL;
    d->chk = NULL;
    d->capchk = 0;
    ZR_CHECK(
        zr_host_alloc_pinned_at(&d->dev, (void **)&d->hdr, n * HEADER_BYTES, __FILE__, __LINE__));
    ZR_ALLOC(d->chk, n);
    d->capchk = n;
    return ZR_OK;
}

static zr_status dev_check(void *x, zr_comm *c, zr_coll_op *op, const void *block,
                           const zr_coll_check *k)
{
    (void)c;
    (void)op;
    zr_coll_dev *d = x;
    ZR_ASSERT(d->nchk < d->capchk);
    size_t i = d->nchk++;
    d->chk[i] = *k;
    size_t bytes = k->bytes < HEADER_BYTES ? k->bytes : HEADER_BYTES;
    memset(d->hdr + i * HEADER_BYTES, 0, HEADER_BYTES);
    return zr_memcpy_async(d->hdr + i * HEADER_BYTES, block, bytes, d->codec);
}

/* The launches take a host array of device pointers; op->work is device memory. */
static zr_status dev_ptr_array(zr_coll_op *op, void *carved, size_t bytes, void **out)
{
    (void)carved;
    return zr_coll_host_scratch(op, bytes, out);
}

/* The cut: queued on the stream the communicator follows (the caller's), not a codec stream. */
static zr_status dev_cut(zr_stream *follow, zr_dtype dst_type, void *dst, zr_dtype src_type,
                         const void *src, size_t n)
{
    if (follow == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "hpZ cut on a device: the communicator follows the legacy default "
                                "stream; give its transport a stream (zr_comm_device_follow)");
    }
    if (dst_type == src_type) {
        return zr_memcpy_async(dst, src, n * zr_dtype_size(src_type), follow);
    }
    if (dst_type == ZR_DTYPE_BF16) {
        return zr_bf16_cuda_from_f32(dst, src, n, follow);
    }
    return zr_bf16_cuda_to_f32(dst, src, n, follow);
}

const zr_coll_local zr_coll_local_cuda = {
    .name = "cuda",
    .copy = dev_copy,
    .zero = dev_zero,
    .to_bf16 = dev_to_bf16,
    .from_bf16 = dev_from_bf16,
    .encode = dev_encode,
    .decode = dev_decode,
    .decode_add = dev_decode_add,
    .sum_requant = dev_sum_requant,
    .mean = dev_mean,
    .expect_checks = dev_expect_checks,
    .check = dev_check,
    .ptr_array = dev_ptr_array,
    .cut = dev_cut,
    .start = dev_start,
    .finish = dev_finish,
    .poll = dev_poll,
    .drain = dev_drain,
    .follow = dev_follow,
    .unfollow = dev_unfollow,
};
