/*
 * zr/optim.h - AdamW and gradient-clipping helpers (schedules: zr/schedule.h)
 * on flat fp32 ranges.
 *
 * This layer sits below the ZeRO engine and knows nothing about ranks: the
 * engine calls zr_adamw_update on whatever shard it owns, after agreeing on
 * the global gradient norm (sum of zr_sumsq over shards). Updates are
 * elementwise, so a sharded update is bit-identical to the unsharded one,
 * and zr_adamw_update split over the process's threads (zr/pool.h) to a
 * single-threaded one. Nothing here depends on MPI.
 */
#ifndef ZR_OPTIM_H
#define ZR_OPTIM_H

#include "zr/base.h"
#include "zr/device.h"

#include <stddef.h>

typedef struct zr_adamw {
    float lr; /* peak learning rate (schedules start from it) */
    float beta1, beta2, eps;
    float weight_decay; /* decoupled, applied where the tensor's decay flag is 1 */
} zr_adamw;

/* GPT-2 style defaults: lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1. */
zr_adamw zr_adamw_default(void);

/*
 * One AdamW step on n elements:
 *     g = grad * grad_scale
 *     m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
 *     param -= lr * (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps)
 *                    + (decay ? weight_decay * param : 0))
 * lr is the scheduled rate (h->lr is ignored here); t >= 1 is the step
 * number for bias correction. m and v start at zero. Ranges may not overlap.
 */
void zr_adamw_update(const zr_adamw *h, float lr, int t, float grad_scale, int decay, float *param,
                     const float *grad, float *m, float *v, size_t n);

/* min(1, max_norm / (norm + 1e-6)); max_norm <= 0 disables clipping (returns 1). */
float zr_clip_scale(double grad_norm, float max_norm);

/*
 * Sum of squares of x in double, in a fixed order that depends only on n:
 * the engine adds these per shard and takes the square root.
 */
double zr_sumsq(const float *x, size_t n);

/* ---- on a CUDA device (device pointers, queued on s; built without CUDA: ZR_ERR_DEVICE) ---- */

/* zr_adamw_update on the device; the same bits as the CPU (NaN payloads aside). */
zr_status zr_adamw_cuda_update(const zr_adamw *h, float lr, int t, float grad_scale, int decay,
                               float *param, const float *grad, float *m, float *v, size_t n,
                               zr_stream *s);

/*
 * Sum of squares of x in double into *result (device memory), using work, a
 * device array of ZR_SUMSQ_CUDA_WORK doubles. The order of the additions is
 * fixed by n alone (src/optim/sumsq_rules.h); zr_sumsq_cuda_order computes
 * the same sum in the same order on the CPU, bit for bit.
 */
#define ZR_SUMSQ_CUDA_WORK 1024
zr_status zr_sumsq_cuda(const float *x, size_t n, double *result, double *work, zr_stream *s);
double zr_sumsq_cuda_order(const float *x, size_t n);

/*
 * Which kernels zr_adamw_update and zr_sumsq run. AUTO (the default) is the
 * widest this CPU supports, chosen at first use; every choice gives the same
 * bits as SCALAR, the reference. Forcing one is for tests and benchmarks.
 */
typedef enum zr_optim_impl {
    ZR_OPTIM_IMPL_AUTO = 0,
    ZR_OPTIM_IMPL_SCALAR,
    ZR_OPTIM_IMPL_SSE2, /* x86-64 baseline */
    ZR_OPTIM_IMPL_AVX2,
    ZR_OPTIM_IMPL_AVX512,
} zr_optim_impl;

/* ZR_ERR_INVALID for an unknown value or one this CPU cannot run (named). */
zr_status zr_optim_set_impl(zr_optim_impl impl);
/* The implementation in use (never AUTO). */
zr_optim_impl zr_optim_get_impl(void);
const char *zr_optim_impl_name(zr_optim_impl impl);

#endif /* ZR_OPTIM_H */
