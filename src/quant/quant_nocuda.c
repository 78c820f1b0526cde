/*
 * quant_nocuda.c - zr/quant_cuda.h in a build without CUDA (the Makefile
 * compiles it instead of quant_cuda.c): every call fails at once with
 * "built without CUDA".
 */
#include "zr/quant_cuda.h"

static zr_status no_cuda(const char *what)
{
    ZR_FAIL(ZR_ERR_DEVICE, "%s: zr was built without CUDA (make CUDA=0, or no nvcc at build time)",
            what);
}

zr_status zr_quant_cuda_encode(const zr_quant_params *p, zr_dtype in_type, const void *x,
                               size_t count, float mul, float *residual, void *block, zr_stream *s)
{
    return no_cuda("quant cuda encode");
}

zr_status zr_quant_cuda_decode(const void *block, zr_dtype out_type, void *out, size_t count,
                               zr_stream *s)
{
    return no_cuda("quant cuda decode");
}

zr_status zr_quant_cuda_decode_add(const void *block, float *acc, size_t count, zr_stream *s)
{
    return no_cuda("quant cuda decode_add");
}

zr_status zr_quant_cuda_sum_requant(const void *const *blocks, int k, size_t count, float mul,
                                    const zr_quant_params *p, float *residual, void *out_block,
                                    zr_stream *s)
{
    return no_cuda("quant cuda sum_requant");
}

zr_status zr_bf16_cuda_from_f32(zr_bf16 *dst, const float *src, size_t n, zr_stream *s)
{
    return no_cuda("bf16 cuda from f32");
}

zr_status zr_bf16_cuda_to_f32(float *dst, const zr_bf16 *src, size_t n, zr_stream *s)
{
    return no_cuda("bf16 cuda to f32");
}

zr_status zr_quant_cuda_add(float *acc, const void *x, zr_dtype x_type, size_t n, zr_stream *s)
{
    return no_cuda("quant cuda add");
}

zr_status zr_quant_cuda_sum_ranks(float *out, const void *in, zr_dtype in_type, int k,
                                  size_t stride, size_t count, float div, zr_stream *s)
{
    return no_cuda("quant cuda sum_ranks");
}
