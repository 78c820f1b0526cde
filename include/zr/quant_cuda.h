/*
 * zr/quant_cuda.h - the block codecs of zr/quant.h on a CUDA device, and the
 * elementwise conversions and sums that go with them.
 *
 * Same wire format, same bits: a block encoded here is byte for byte the
 * block zr_quant_encode writes on the CPU (and decodes there to the same
 * values), because both run the rules of src/quant/quant_rules.h. The sums
 * add in the order the CPU code does (rank 0 first).
 *
 * Every pointer is device memory of the stream's GPU, except the host arrays
 * named so. The work is queued on the stream and done when the stream gets
 * there; arguments are checked at once (ZR_ERR_INVALID), a build without CUDA
 * fails every call with ZR_ERR_DEVICE. Blocks start at 4-byte-aligned
 * addresses, as they do in every message; 16-byte-aligned elements get
 * 16-byte loads and stores (what cudaMalloc gives, and zr_device_alloc_at).
 *
 * A kernel cannot return an error, and the host does not read device memory
 * to check a block: a block whose header does not hold count elements of a
 * valid format decodes to NaN (every element; decode_add sets the
 * accumulator to NaN), and a sum_requant whose inputs are not such blocks
 * writes an output block with magic 0, which zr_quant_validate refuses.
 * Validate what arrives from elsewhere before decoding it.
 */
#ifndef ZR_QUANT_CUDA_H
#define ZR_QUANT_CUDA_H

#include "zr/device.h"
#include "zr/quant.h"

/*
 * zr_quant_encode on the device: count elements of x (in_type) times mul,
 * plus residual (error feedback, optional; updated), into block (of
 * zr_quant_block_bytes(p, count) bytes). The header's nonfinite_groups
 * counts the groups that held Inf or NaN (read it from the block).
 */
zr_status zr_quant_cuda_encode(const zr_quant_params *p, zr_dtype in_type, const void *x,
                               size_t count, float mul, float *residual, void *block, zr_stream *s);

/* zr_quant_decode and zr_quant_decode_add on the device. */
zr_status zr_quant_cuda_decode(const void *block, zr_dtype out_type, void *out, size_t count,
                               zr_stream *s);
zr_status zr_quant_cuda_decode_add(const void *block, float *acc, size_t count, zr_stream *s);

/*
 * zr_quant_sum_requant on the device (qgZ's middle hop): blocks is a host
 * array of k device pointers (k <= ZR_QUANT_CUDA_MAX_BLOCKS), each a block
 * of count elements in any format; their sum, in the order given, times mul
 * (plus residual), is quantized into out_block with p.
 */
#define ZR_QUANT_CUDA_MAX_BLOCKS 64
zr_status zr_quant_cuda_sum_requant(const void *const *blocks, int k, size_t count, float mul,
                                    const zr_quant_params *p, float *residual, void *out_block,
                                    zr_stream *s);

/* zr_bf16_from_f32_n / zr_bf16_to_f32_n on the device. */
zr_status zr_bf16_cuda_from_f32(zr_bf16 *dst, const float *src, size_t n, zr_stream *s);
zr_status zr_bf16_cuda_to_f32(float *dst, const zr_bf16 *src, size_t n, zr_stream *s);

/*
 * acc[i] = acc[i] + x[i] for n elements, x fp32 or bf16 (widened exactly):
 * the CPU's `acc[i] += x[i]`, bit for bit. The ZeRO engine folds a reduced
 * gradient into its shard with it, the GPU model its bf16 gradients into
 * the engine's fp32 buffers.
 */
zr_status zr_quant_cuda_add(float *acc, const void *x, zr_dtype x_type, size_t n, zr_stream *s);

/*
 * The rank-ordered sum of a reduce-scatter: out[i] = ((in_0[i] + in_1[i]) +
 * ... + in_{k-1}[i]) / div, in fp32, where in_j = in + j * stride elements of
 * in_type (fp32, or bf16 widened exactly) and the division is a true one
 * (div = k gives the mean; 1 leaves the sum).
 */
zr_status zr_quant_cuda_sum_ranks(float *out, const void *in, zr_dtype in_type, int k,
                                  size_t stride, size_t count, float div, zr_stream *s);

#endif /* ZR_QUANT_CUDA_H */
