/*
 * cuda_pipeline.h - the GPU emulator's asynchronous copies to shared memory
 * (issue 42): __pipeline_memcpy_async copies at once, so commit and wait
 * have nothing to wait for. A kernel that reads a copy's destination before
 * its __pipeline_wait_prior and the barrier after it is wrong on a GPU and
 * not caught here; what the emulator checks is the rest of the kernel.
 */
#ifndef ZR_EMU_CUDA_PIPELINE_H
#define ZR_EMU_CUDA_PIPELINE_H

#include <stddef.h>
#include <string.h>

/* size bytes (4, 8 or 16) from global src to shared dst; the last zfill are zeros */
static inline void __pipeline_memcpy_async(void *dst, const void *src, size_t size,
                                           size_t zfill = 0)
{
    memcpy(dst, src, size - zfill);
    memset((char *)dst + (size - zfill), 0, zfill);
}

static inline void __pipeline_commit(void) {}

static inline void __pipeline_wait_prior(size_t prior)
{
    (void)prior;
}

#endif /* ZR_EMU_CUDA_PIPELINE_H */
