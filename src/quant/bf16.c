/*
 * bf16.c - element types of the codecs: fp32 <-> bf16 conversion of values.
 *
 * bf16 is the top half of an fp32, so widening is a shift and narrowing is a
 * rounding of the dropped 16 bits. The rounding rule lives in bf16_rules.h
 * (zr_quant_bf16_round) because the vector kernels and the CUDA kernels must
 * reproduce it exactly; these functions are the public face of the same rule.
 * The array casts run on the process's pool (zr/pool.h) for long arrays.
 */
#include "quant_impl.h"

#include "zr/pool.h"

size_t zr_dtype_size(zr_dtype t)
{
    switch (t) {
    case ZR_DTYPE_F32:
        return 4;
    case ZR_DTYPE_BF16:
        return 2;
    }
    return 0;
}

const char *zr_dtype_name(zr_dtype t)
{
    switch (t) {
    case ZR_DTYPE_F32:
        return "fp32";
    case ZR_DTYPE_BF16:
        return "bf16";
    }
    return "unknown dtype";
}

zr_bf16 zr_bf16_from_f32(float x)
{
    return zr_quant_bf16_round(x);
}

float zr_bf16_to_f32(zr_bf16 x)
{
    return zr_quant_bf16_widen(x);
}

/* Elements per task of the casts: tens of microseconds of copying, far over the pool's hand-off. */
#define CAST_GRAIN 65536

typedef struct cast_job {
    void *dst;
    const void *src;
} cast_job;

/* Plain loops: the compiler vectorizes both with integer ops, which keeps
 * the exact rounding rule (no bf16 instruction flushes denormals here). Each
 * element alone, so splitting them over the pool changes no bit. */
static void narrow_task(void *arg, size_t begin, size_t end, int thread)
{
    (void)thread;
    const cast_job *j = arg;
    zr_bf16 *dst = j->dst;
    const float *src = j->src;
    for (size_t i = begin; i < end; i++) {
        dst[i] = zr_quant_bf16_round(src[i]);
    }
}

static void widen_task(void *arg, size_t begin, size_t end, int thread)
{
    (void)thread;
    const cast_job *j = arg;
    float *dst = j->dst;
    const zr_bf16 *src = j->src;
    for (size_t i = begin; i < end; i++) {
        dst[i] = zr_quant_bf16_widen(src[i]);
    }
}

void zr_bf16_from_f32_n(zr_bf16 *dst, const float *src, size_t n)
{
    cast_job j = {dst, src};
    zr_parallel_for(n, CAST_GRAIN, narrow_task, &j);
}

void zr_bf16_to_f32_n(float *dst, const zr_bf16 *src, size_t n)
{
    cast_job j = {dst, src};
    zr_parallel_for(n, CAST_GRAIN, widen_task, &j);
}
