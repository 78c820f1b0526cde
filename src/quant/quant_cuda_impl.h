/*
 * quant_cuda_impl.h - the seam between the codec's CUDA kernels
 * (quant_cuda.cu, C++) and their C API (quant_cuda.c, zr/quant_cuda.h): one
 * argument struct per kind of launch and the launchers, which queue the
 * work on a stream and return the runtime's status. The C side checks the
 * arguments and turns errors into zr_status; the kernels trust what it
 * checked (sizes, alignment, parameters).
 *
 * Not installed; only src/quant includes it. Exists only with CUDA.
 */
#ifndef ZR_QUANT_CUDA_IMPL_H
#define ZR_QUANT_CUDA_IMPL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the most input blocks of one fused decode-sum-requantize */
#define ZR_QUANT_K_MAX_IN 64

/* What a value to quantize is made of. */
enum { ZR_QUANT_K_SRC_F32 = 0, ZR_QUANT_K_SRC_BF16 = 1, ZR_QUANT_K_SRC_BLOCKS = 2 };

/* One encode (SRC_F32/BF16) or decode-sum-requantize (SRC_BLOCKS). */
typedef struct zr_quant_k_encode {
    const void *x;                        /* input elements (F32/BF16) */
    const uint8_t *in[ZR_QUANT_K_MAX_IN]; /* input blocks (BLOCKS), summed in this order */
    int k;                                /* how many */
    float *r;                             /* residual (error feedback) or NULL */
    uint8_t *block;                       /* the output block, 4-byte aligned */
    uint32_t header[8];                   /* its header's words, nonfinite_groups (word 3) left 0 */
    uint64_t count;                       /* elements */
    uint64_t payload_offset;              /* bytes from the block start to the payload */
    float mul;                            /* x * mul (+ r) is quantized */
    int src, bits, asym, group;
    int vec_in;  /* x and r are 16-byte aligned: vector loads and stores */
    int vec_out; /* the payload is 8-byte aligned: 8-byte stores of INT8 codes */
} zr_quant_k_encode;

/* Decode of one block into fp32, bf16 or an fp32 accumulator. */
enum { ZR_QUANT_K_OUT_F32 = 0, ZR_QUANT_K_OUT_BF16 = 1, ZR_QUANT_K_OUT_ADD = 2 };

typedef struct zr_quant_k_decode {
    const uint8_t *block; /* 4-byte aligned; the kernel checks its header against count */
    void *out;
    uint64_t count;
    int mode;
    int vec; /* out is 16-byte aligned */
} zr_quant_k_decode;

/* Elementwise work: bf16 casts, the rank-ordered sum, and accumulation into fp32. */
enum {
    ZR_QUANT_K_TO_BF16 = 0,
    ZR_QUANT_K_TO_F32 = 1,
    ZR_QUANT_K_SUM_F32 = 2,
    ZR_QUANT_K_SUM_BF16 = 3,
    ZR_QUANT_K_ADD_F32 = 4,
    ZR_QUANT_K_ADD_BF16 = 5
};

typedef struct zr_quant_k_elementwise {
    const void *in;  /* casts, adds: n elements; sums: k rows of stride elements */
    void *out;       /* adds: the fp32 accumulator, read and written */
    uint64_t n;      /* elements out */
    uint64_t stride; /* sums: elements from one input row to the next */
    int op, k;
    float div; /* sums: the sum is divided by div (a true division) */
    int vec;   /* every row and out 16-byte aligned */
} zr_quant_k_elementwise;

cudaError_t zr_quant_k_launch_encode(const zr_quant_k_encode *a, cudaStream_t s);
cudaError_t zr_quant_k_launch_decode(const zr_quant_k_decode *a, cudaStream_t s);
cudaError_t zr_quant_k_launch_elementwise(const zr_quant_k_elementwise *a, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* ZR_QUANT_CUDA_IMPL_H */
