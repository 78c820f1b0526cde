/*
 * gpt_backend_impl.h - the GPT's backend instances (zr/gpt_engine.h,
 * zr_gpt_backend_i), which gpt_engine.c's list registers: the CPU's
 * (gpt_backend_cpu.c) and the CUDA one (gpt_backend_cuda.c).
 */
#ifndef ZR_GPT_BACKEND_IMPL_H
#define ZR_GPT_BACKEND_IMPL_H

#include "zr/gpt_engine.h"

extern const zr_gpt_backend_i zr_gpt_backend_cpu;
extern const zr_gpt_backend_i zr_gpt_backend_cuda;

#endif /* ZR_GPT_BACKEND_IMPL_H */
