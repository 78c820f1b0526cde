/*
 * quant_cuda.c - the C API of the codec's CUDA kernels (zr/quant_cuda.h):
 * checks every argument, lays out the output block's header on the host
 * (the kernels only add the count of non-finite groups), decides where
 * 16-byte accesses are allowed, and turns launch errors into zr_status.
 *
 * The kernels are quant_cuda.cu; this file only sees their launchers
 * (quant_cuda_impl.h). Compiled only where CUDA is built; a build without
 * compiles quant_nocuda.c instead.
 */
#include "zr/quant_cuda.h"

#include "../base/device_impl.h"
#include "quant_cuda_impl.h"
#include "quant_rules.h"

#include <string.h>

static int aligned(const void *p, uintptr_t to)
{
    return (uintptr_t)p % to == 0;
}

/* The CUDA stream of s, or a message naming what asked. */
static zr_status cuda_stream(zr_stream *s, const char *what, cudaStream_t *out)
{
    *out = NULL;
    if (s == NULL || zr_stream_device(s)->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: needs a stream of a CUDA device, got %s", what,
                s == NULL ? "none" : "a CPU stream");
    }
    *out = zr_stream_cuda(s);
    return ZR_OK;
}

static zr_status block_ptr_ok(const void *block, const char *what)
{
    if (block == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: NULL block", what);
    }
    if (!aligned(block, 4)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: block at %p is not 4-byte aligned", what, block);
    }
    return ZR_OK;
}

/* Output side of an encode: the header's words and where the payload goes. */
static void output_block(const zr_quant_params *p, size_t count, void *block, zr_quant_k_encode *a)
{
    zr_quant_header h;
    memset(&h, 0, sizeof h);
    h.magic = ZR_QUANT_MAGIC;
    h.bits = (uint8_t)p->bits;
    h.scheme = (uint8_t)p->scheme;
    h.group = (uint32_t)p->group;
    h.count = count;
    h.payload_offset =
        zr_quant_payload_offset(p->scheme == ZR_QUANT_ASYM, (uint64_t)p->group, count);
    memcpy(a->header, &h, sizeof h);
    a->block = block;
    a->count = count;
    a->payload_offset = h.payload_offset;
    a->bits = p->bits;
    a->asym = p->scheme == ZR_QUANT_ASYM;
    a->group = p->group;
    a->vec_out = aligned((const uint8_t *)block + h.payload_offset, 8);
}

zr_status zr_quant_cuda_encode(const zr_quant_params *p, zr_dtype in_type, const void *x,
                               size_t count, float mul, float *residual, void *block, zr_stream *s)
{
    const char *what = "quant cuda encode";
    ZR_CHECK(zr_quant_params_check(p));
    if (in_type != ZR_DTYPE_F32 && in_type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: unknown input dtype %d", what, (int)in_type);
    }
    if (x == NULL && count > 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: NULL input", what);
    }
    ZR_CHECK(block_ptr_ok(block, what));
    cudaStream_t cs;
    ZR_CHECK(cuda_stream(s, what, &cs));
    zr_quant_k_encode a;
    memset(&a, 0, sizeof a);
    output_block(p, count, block, &a);
    a.x = x;
    a.r = residual;
    a.mul = mul;
    a.src = in_type == ZR_DTYPE_BF16 ? ZR_QUANT_K_SRC_BF16 : ZR_QUANT_K_SRC_F32;
    a.vec_in = aligned(x, 16) && aligned(residual, 16);
    ZR_CUDA_CHECK(zr_quant_k_launch_encode(&a, cs));
    return ZR_OK;
}

static zr_status decode(const void *block, int mode, void *out, size_t count, zr_stream *s,
                        const char *what)
{
    ZR_CHECK(block_ptr_ok(block, what));
    if (out == NULL && count > 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: NULL output", what);
    }
    cudaStream_t cs;
    ZR_CHECK(cuda_stream(s, what, &cs));
    zr_quant_k_decode a = {(const uint8_t *)block, out, count, mode, aligned(out, 16)};
    ZR_CUDA_CHECK(zr_quant_k_launch_decode(&a, cs));
    return ZR_OK;
}

zr_status zr_quant_cuda_decode(const void *block, zr_dtype out_type, void *out, size_t count,
                               zr_stream *s)
{
    if (out_type != ZR_DTYPE_F32 && out_type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "quant cuda decode: unknown output dtype %d", (int)out_type);
    }
    return decode(block, out_type == ZR_DTYPE_BF16 ? ZR_QUANT_K_OUT_BF16 : ZR_QUANT_K_OUT_F32, out,
                  count, s, "quant cuda decode");
}

zr_status zr_quant_cuda_decode_add(const void *block, float *acc, size_t count, zr_stream *s)
{
    return decode(block, ZR_QUANT_K_OUT_ADD, acc, count, s, "quant cuda decode_add");
}

zr_status zr_quant_cuda_sum_requant(const void *const *blocks, int k, size_t count, float mul,
                                    const zr_quant_params *p, float *residual, void *out_block,
                                    zr_stream *s)
{
    const char *what = "quant cuda sum_requant";
    ZR_CHECK(zr_quant_params_check(p));
    if (blocks == NULL || k < 1 || k > ZR_QUANT_CUDA_MAX_BLOCKS) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: need 1..%d input blocks (k = %d)", what,
                ZR_QUANT_CUDA_MAX_BLOCKS, k);
    }
    for (int j = 0; j < k; j++) {
        ZR_CHECK(block_ptr_ok(blocks[j], what));
    }
    ZR_CHECK(block_ptr_ok(out_block, what));
    cudaStream_t cs;
    ZR_CHECK(cuda_stream(s, what, &cs));
    zr_quant_k_encode a;
    memset(&a, 0, sizeof a);
    output_block(p, count, out_block, &a);
    for (int j = 0; j < k; j++) {
        a.in[j] = (const uint8_t *)blocks[j];
    }
    a.k = k;
    a.r = residual;
    a.mul = mul;
    a.src = ZR_QUANT_K_SRC_BLOCKS;
    a.vec_in = aligned(residual, 16);
    ZR_CUDA_CHECK(zr_quant_k_launch_encode(&a, cs));
    return ZR_OK;
}

static zr_status elementwise(zr_quant_k_elementwise *a, zr_stream *s, const char *what)
{
    if ((a->in == NULL || a->out == NULL) && a->n > 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: NULL %s", what, a->in == NULL ? "input" : "output");
    }
    cudaStream_t cs;
    ZR_CHECK(cuda_stream(s, what, &cs));
    ZR_CUDA_CHECK(zr_quant_k_launch_elementwise(a, cs));
    return ZR_OK;
}

zr_status zr_bf16_cuda_from_f32(zr_bf16 *dst, const float *src, size_t n, zr_stream *s)
{
    zr_quant_k_elementwise a = {
        src, dst, n, 0, ZR_QUANT_K_TO_BF16, 1, 1.0f, aligned(src, 16) && aligned(dst, 16)};
    return elementwise(&a, s, "bf16 cuda from f32");
}

zr_status zr_bf16_cuda_to_f32(float *dst, const zr_bf16 *src, size_t n, zr_stream *s)
{
    zr_quant_k_elementwise a = {
        src, dst, n, 0, ZR_QUANT_K_TO_F32, 1, 1.0f, aligned(src, 16) && aligned(dst, 16)};
    return elementwise(&a, s, "bf16 cuda to f32");
}

zr_status zr_quant_cuda_add(float *acc, const void *x, zr_dtype x_type, size_t n, zr_stream *s)
{
    const char *what = "quant cuda add";
    if (x_type != ZR_DTYPE_F32 && x_type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: unknown input dtype %d", what, (int)x_type);
    }
    zr_quant_k_elementwise a = {x,
                                acc,
                                n,
                                0,
                                x_type == ZR_DTYPE_BF16 ? ZR_QUANT_K_ADD_BF16 : ZR_QUANT_K_ADD_F32,
                                1,
                                1.0f,
                                aligned(x, 16) && aligned(acc, 16)};
    return elementwise(&a, s, what);
}

zr_status zr_quant_cuda_sum_ranks(float *out, const void *in, zr_dtype in_type, int k,
                                  size_t stride, size_t count, float div, zr_stream *s)
{
    const char *what = "quant cuda sum_ranks";
    if (in_type != ZR_DTYPE_F32 && in_type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: unknown input dtype %d", what, (int)in_type);
    }
    if (k < 1 || stride < count) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s: need k >= 1 rows of stride >= count (k %d, stride %zu, count %zu)", what, k,
                stride, count);
    }
    size_t row_bytes = stride * zr_dtype_size(in_type);
    zr_quant_k_elementwise a = {in,
                                out,
                                count,
                                stride,
                                in_type == ZR_DTYPE_BF16 ? ZR_QUANT_K_SUM_BF16 : ZR_QUANT_K_SUM_F32,
                                k,
                                div,
                                aligned(in, 16) && aligned(out, 16) && row_bytes % 16 == 0};
    return elementwise(&a, s, what);
}
