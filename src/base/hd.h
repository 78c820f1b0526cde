/*
 * hd.h - ZR_HD, the storage class of functions that run on the host and on a
 * CUDA device alike (zr's CUDA build contract, issue 23).
 *
 * The per-element rules of the codecs and of AdamW (src/quant/quant_rules.h,
 * src/quant/bf16_rules.h, src/optim/adamw_rules.h) are written once as ZR_HD
 * functions, in headers that are valid C11 and CUDA C++, and included by the
 * CPU code and by the kernels alike, so every build computes the same bits
 * from the same source:
 *   nvcc                       static inline __host__ __device__
 *   the GPU emulator (g++)     static inline (__host__ and __device__ are
 *                              empty there; the emulator build's C files have
 *                              ZR_CUDA_EMU too and are plain C11)
 *   C11                        static inline
 * ZR_RESTRICT is C's restrict in both languages.
 */
#ifndef ZR_HD_H
#define ZR_HD_H

#ifdef __CUDACC__
#define ZR_HD static inline __host__ __device__
#else
#define ZR_HD static inline
#endif

#ifdef __cplusplus
#define ZR_RESTRICT __restrict__
#else
#define ZR_RESTRICT restrict
#endif

#endif /* ZR_HD_H */
