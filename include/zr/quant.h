/*
 * zr/quant.h - block quantization codecs: the wire formats of ZeRO++.
 *
 * qwZ sends weights as INT8, qgZ sends gradients as INT4. Both use
 * per-group scales: the buffer is cut into groups of G elements (the last
 * group may be shorter) and each group is quantized on its own.
 *
 * Symmetric (ZR_QUANT_SYM, the ZeRO++ scheme), b bits:
 *     absmax = max |x| over the group
 *     scale  = absmax / 2^(b-1)              (stored as fp32)
 *     q      = clamp(round_half_even(x / scale), -2^(b-1), 2^(b-1)-1)
 *     x'     = q * scale
 *   absmax = 0 gives scale = 0 and exact zeros (never NaN).
 * Asymmetric (ZR_QUANT_ASYM), b bits:
 *     scale  = (max - min) / (2^b - 1), zero point = min (both stored as fp32)
 *     q      = clamp(round_half_even((x - min) / scale), 0, 2^b - 1)
 *     x'     = min + q * scale
 *
 * Error bound: for every element of a finite group |x - x'| <= scale / 2,
 * except in the symmetric scheme for x > (2^(b-1) - 1/2) * scale (only values
 * near +absmax: +absmax itself maps to 2^(b-1), one past the largest code, and
 * is clamped), where |x - x'| <= scale. Both hold up to the fp32 rounding of
 * x / scale and q * scale (a relative 2^-16 of the bound), and, when the
 * scale is subnormal or underflows to 0 (absmax below 2^(b-1) * 2^-126), up to
 * an absolute 2^(b-149): a group whose scale underflows to 0 decodes to zeros
 * (sym) or to min (asym), like an all-zero group.
 *
 * Arithmetic (every implementation, so results are bit-identical): v = x * mul,
 * then v = v + residual; t = v / scale (or (v - min) / scale) as a true fp32
 * division; clamp t to the code range in fp32; round half to even in the
 * default rounding mode; x' = q * scale (or min + q * scale). The asymmetric
 * scale is (max - min) computed in double, divided by 2^b - 1, rounded to fp32.
 *
 * 4-bit packing: two values per byte, element 2i in the low nibble of byte i,
 * element 2i+1 in the high nibble; a final odd element leaves the high nibble 0.
 * Symmetric values are stored as two's complement nibbles, asymmetric as
 * unsigned nibbles.
 *
 * Non-finite input: a group containing Inf or NaN is counted (returned to the
 * caller and stored in the block header) and its stored scale is NaN with a
 * zero payload, so the decoded group is NaN: the problem travels to the
 * receiver instead of turning into plausible finite garbage. Non-finite means
 * the value quantized (x * mul + residual) is Inf/NaN, so a finite x that
 * overflows after mul counts too. With error feedback the residual of such
 * a group is reset to 0 (a NaN residual would poison every later step).
 * Stored NaN scales are the quiet NaN 0x7fc00000.
 *
 * Wire block (one contiguous, self-describing message):
 *     zr_quant_header   (32 bytes: magic, bits, scheme, group, count, ...)
 *     scales       fp32 x ngroups  (symmetric)  or  fp32 x 2*ngroups (asym: scale, min pairs)
 *     payload      count bytes (8-bit) or ceil(count/2) bytes (4-bit),
 *                  zero-padded to a multiple of 4 bytes
 * zr_quant_block_bytes gives the exact size; blocks are 4-byte aligned in size
 * so that several can be packed back to back in one message.
 *
 * Implementations: a scalar reference (the oracle) and vector paths chosen at
 * run time from the CPU (AVX2, AVX-512); all produce bit-identical blocks.
 * Threads: encode, decode, decode_add, sum_requant and the array casts split
 * long arrays over the process's pool (zr/pool.h, zr.train.threads), whole
 * groups per thread, so the output is the same bits at any thread count.
 * Call them from the rank's main thread (sum_requant allocates its scratch).
 */
#ifndef ZR_QUANT_H
#define ZR_QUANT_H

#include "zr/base.h"

/* ---- element types ------------------------------------------------------ */

typedef enum zr_dtype {
    ZR_DTYPE_F32 = 0,
    ZR_DTYPE_BF16 = 1,
} zr_dtype;

typedef uint16_t zr_bf16;

size_t zr_dtype_size(zr_dtype t);
const char *zr_dtype_name(zr_dtype t);

/*
 * fp32 -> bf16 with round-to-nearest-even on the 16 dropped bits; NaN stays
 * NaN (quiet), +-Inf stays Inf, values that round past the largest bf16
 * become Inf. bf16 -> fp32 is exact. These are conversions of values, never
 * reinterpretations of fp16 bits.
 */
zr_bf16 zr_bf16_from_f32(float x);
float zr_bf16_to_f32(zr_bf16 x);
void zr_bf16_from_f32_n(zr_bf16 *dst, const float *src, size_t n);
void zr_bf16_to_f32_n(float *dst, const zr_bf16 *src, size_t n);

/* ---- codec parameters ---------------------------------------------------- */

typedef enum zr_quant_scheme {
    ZR_QUANT_SYM = 0,
    ZR_QUANT_ASYM = 1,
} zr_quant_scheme;

typedef struct zr_quant_params {
    int bits;               /* 8 or 4 */
    int group;              /* elements per group: multiple of 8, 32..65536 */
    zr_quant_scheme scheme; /* ZR_QUANT_SYM (ZeRO++) or ZR_QUANT_ASYM */
} zr_quant_params;

/*
 * Default group size, chosen by measurement (zr bench quant, AVX-512, one
 * core of the CI machine, Gaussian data): RMS error / RMS grows about 5% per
 * doubling of G (int8 sym 5.8e-3 at 32, 7.8e-3 at 1024, 8.2e-3 at 2048,
 * 1.0e-2 at 65536; int4 0.094 / 0.125 / 0.132 / 0.161), while int8 quantize
 * throughput is lowest for small groups (9.5 GB/s at 32, 20 at 256), peaks
 * at 512..1024 (25-27 GB/s, the two passes over a group stay in L1) and
 * falls back to 17-24 GB/s for larger ones. 1024 is at the throughput peak,
 * its scales cost 0.78% of an int4 payload (0.39% of int8), and it halves
 * the padding of shards against 2048 for 5% less error.
 */
#define ZR_QUANT_DEFAULT_GROUP 1024

/* Check bits, group and scheme; ZR_ERR_INVALID with a message naming the bad field. */
zr_status zr_quant_params_check(const zr_quant_params *p);

/* ---- wire block ----------------------------------------------------------- */

#define ZR_QUANT_MAGIC 0x3151525au /* "ZRQ1" little-endian */

typedef struct zr_quant_header {
    uint32_t magic;
    uint8_t bits;
    uint8_t scheme;
    uint16_t reserved;
    uint32_t group;
    uint32_t nonfinite_groups; /* groups that held Inf or NaN at encode time */
    uint64_t count;            /* elements */
    uint64_t payload_offset;   /* bytes from the header start to the payload */
} zr_quant_header;

_Static_assert(sizeof(zr_quant_header) == 32, "zr_quant_header is part of the wire format");

/* Exact size in bytes of a block holding count elements (a multiple of 4). */
size_t zr_quant_block_bytes(const zr_quant_params *p, size_t count);

/*
 * Quantize count elements of x (type in_type) into block, which must have
 * zr_quant_block_bytes(p, count) bytes. Each element is multiplied by mul
 * first (1.0f for none; qgZ passes 1/W to average exactly once).
 *
 * Error feedback: if residual is non-NULL (count fp32 values, caller-owned),
 * the value quantized is x*mul + residual, and residual is overwritten with
 * (x*mul + residual) - dequant(q), the part this block could not carry.
 *
 * *nonfinite (may be NULL) receives the number of groups that held Inf/NaN.
 * x may be NULL when count is 0 (a header-only block).
 */
zr_status zr_quant_encode(const zr_quant_params *p, zr_dtype in_type, const void *x, size_t count,
                          float mul, float *residual, void *block, size_t *nonfinite);

/*
 * Validate a received block of block_bytes bytes: magic, bits, scheme and
 * group must match expect (if not NULL) and the element count must equal
 * expect_count (unless it is SIZE_MAX); the size must equal
 * zr_quant_block_bytes. ZR_ERR_FORMAT with a message saying which field is wrong.
 */
zr_status zr_quant_validate(const void *block, size_t block_bytes, const zr_quant_params *expect,
                            size_t expect_count);

/* Element count of a block (after validation). */
size_t zr_quant_block_count(const void *block);

/*
 * Dequantize a validated block into count elements of out_type. count must be
 * the block's count (ZR_ERR_INVALID otherwise); a block whose header is not a
 * codec header gives ZR_ERR_FORMAT (decoders re-check only the header: run
 * zr_quant_validate on anything received).
 */
zr_status zr_quant_decode(const void *block, zr_dtype out_type, void *out, size_t count);

/* acc[i] += dequant(block)[i]: fused dequantize-and-accumulate for reductions. */
zr_status zr_quant_decode_add(const void *block, float *acc, size_t count);

/*
 * qgZ's middle hop: dequantize the k blocks (each of count elements), sum them
 * in fp32 in the order given, multiply by mul, and quantize the sum into
 * out_block with parameters p (with error feedback through residual as in
 * zr_quant_encode). *nonfinite receives the non-finite groups of the output.
 * The input blocks may use any bits, scheme and group, each its own; the
 * result is bit-identical to zr_quant_decode of blocks[0], zr_quant_decode_add
 * of the others, then zr_quant_encode of the fp32 sum.
 */
zr_status zr_quant_sum_requant(const void *const *blocks, int k, size_t count, float mul,
                               const zr_quant_params *p, float *residual, void *out_block,
                               size_t *nonfinite);

/* ---- implementation selection (tests and benchmarks) -------------------- */

typedef enum zr_quant_impl {
    ZR_QUANT_IMPL_AUTO = 0, /* best the CPU supports */
    ZR_QUANT_IMPL_SCALAR,   /* the reference oracle */
    ZR_QUANT_IMPL_AVX2,
    ZR_QUANT_IMPL_AVX512,
} zr_quant_impl;

/* Force an implementation; ZR_ERR_INVALID if this CPU cannot run it. */
zr_status zr_quant_set_impl(zr_quant_impl impl);
zr_quant_impl zr_quant_get_impl(void);
const char *zr_quant_impl_name(zr_quant_impl impl);

#endif /* ZR_QUANT_H */
