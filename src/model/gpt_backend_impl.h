/*
 * gpt_backend_impl.h - the GPT's backend instances (zr/gpt_engine.h,
 * zr_gpt_backend_i), which gpt_engine.c's list registers by architecture and
 * device: GPT-2's on the CPU (gpt_backend_cpu.c) and CUDA (gpt_backend_cuda.c),
 * the Llama family's on the CPU (llama_backend_cpu.c).
 */
#ifndef ZR_GPT_BACKEND_IMPL_H
#define ZR_GPT_BACKEND_IMPL_H

#include "zr/gpt_engine.h"

extern const zr_gpt_backend_i zr_gpt_backend_cpu;
extern const zr_gpt_backend_i zr_gpt_backend_cuda;
extern const zr_gpt_backend_i zr_llama_backend_cpu; /* llama_backend_cpu.c */

/*
 * The CUDA backend's unit buffers (gpt_backend_cuda.c), sized in every build
 * (cuda_host.c: zr_gpt_cuda_engine_bytes): the elements of the units of each
 * slot (unit 0, a block, the last unit), and whether the engine's types ask
 * for bf16 parameter and gradient buffers (1) or none (0).
 */
void zr_gpt_cuda_slot_numel(const zr_gpt_config *cfg, size_t n[3]);
void zr_gpt_cuda_buffer_kinds(zr_dtype type, const zr_engine_config *ecfg, int *params, int *grads);

#endif /* ZR_GPT_BACKEND_IMPL_H */
