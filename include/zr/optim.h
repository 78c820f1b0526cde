/*
 * zr/optim.h - AdamW, learning-rate schedules and gradient-clipping helpers
 * on flat fp32 ranges.
 *
 * This layer sits below the ZeRO engine and knows nothing about ranks: the
 * engine calls zr_adamw_update on whatever shard it owns, after agreeing on
 * the global gradient norm (sum of zr_sumsq over shards). Updates are
 * elementwise, so a sharded update is bit-identical to the unsharded one.
 * Nothing here depends on MPI.
 */
#ifndef ZR_OPTIM_H
#define ZR_OPTIM_H

#include "zr/base.h"

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
void zr_adamw_update(const zr_adamw *h, float lr, int t, float grad_scale, int decay,
                     float *param, const float *grad, float *m, float *v, size_t n);

typedef enum zr_lr_schedule { ZR_LR_CONSTANT, ZR_LR_COSINE, ZR_LR_LINEAR } zr_lr_schedule;

/* Parses "constant", "cosine" or "linear"; ZR_ERR_INVALID names the bad value. */
zr_status zr_lr_schedule_parse(const char *name, zr_lr_schedule *out);

/*
 * Learning rate at step (0-based): linear warmup lr_max * (step + 1) / warmup
 * for step < warmup_steps, then from lr_max down to lr_min at total_steps
 * (cosine or linear; constant stays at lr_max); lr_min after total_steps.
 */
float zr_lr_at(zr_lr_schedule s, float lr_max, float lr_min, int warmup_steps, int total_steps,
               int step);

/* min(1, max_norm / (norm + 1e-6)); max_norm <= 0 disables clipping (returns 1). */
float zr_clip_scale(double grad_norm, float max_norm);

/*
 * Sum of squares of x in double, in a fixed order that depends only on n:
 * the engine adds these per shard and takes the square root.
 */
double zr_sumsq(const float *x, size_t n);

/* 1 if every element is finite, else 0 (vectorized). */
int zr_all_finite(const float *x, size_t n);

#endif /* ZR_OPTIM_H */
